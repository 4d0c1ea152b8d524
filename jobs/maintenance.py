"""``./spark-submit.sh jobs/maintenance.py [--once] ...`` runs the job of engine/spark/jobs/maintenance.py."""

from engine.spark.jobs.maintenance import PassOptions, run_maintenance
from engine.spark.jobs.registry import entry_point

__all__ = ["PassOptions", "main", "run_maintenance"]  # re-exported for notebooks and scripts
main = entry_point("maintenance", __name__)
