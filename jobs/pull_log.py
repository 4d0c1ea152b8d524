"""``./spark-submit.sh jobs/pull_log.py [--once] ...`` runs the job of engine/spark/jobs/pull_log.py."""

from engine.spark.jobs.pull_log import PullLogStats, run_pull_log
from engine.spark.jobs.registry import entry_point

__all__ = ["PullLogStats", "main", "run_pull_log"]  # re-exported for notebooks and scripts
main = entry_point("pull_log", __name__)
