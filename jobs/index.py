"""``./spark-submit.sh jobs/index.py [--once] ...`` runs the job of engine/spark/jobs/index.py."""

from engine.spark.jobs.index import IndexStats, run_index
from engine.spark.jobs.registry import entry_point

__all__ = ["IndexStats", "main", "run_index"]  # re-exported for notebooks and scripts
main = entry_point("index", __name__)
