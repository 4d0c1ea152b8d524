"""``./spark-submit.sh jobs/dispatch.py [--once] ...`` runs the job of engine/spark/jobs/dispatch.py."""

from engine.spark.jobs.dispatch import DispatchStats, run_dispatch
from engine.spark.jobs.registry import entry_point

__all__ = ["DispatchStats", "main", "run_dispatch"]  # re-exported for notebooks and scripts
main = entry_point("dispatch", __name__)
