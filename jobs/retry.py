"""``./spark-submit.sh jobs/retry.py [--once] ...`` runs the job of engine/spark/jobs/retry.py."""

from engine.spark.jobs.registry import entry_point
from engine.spark.jobs.retry import RetryStats, run_retry

__all__ = ["RetryStats", "main", "run_retry"]  # re-exported for notebooks and scripts
main = entry_point("retry", __name__)
