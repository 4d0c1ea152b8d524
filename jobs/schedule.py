"""``./spark-submit.sh jobs/schedule.py [--once] ...`` runs the job of engine/spark/jobs/schedule.py."""

from engine.spark.jobs.registry import entry_point
from engine.spark.jobs.schedule import ScheduleStats, run_schedule

__all__ = ["ScheduleStats", "main", "run_schedule"]  # re-exported for notebooks and scripts
main = entry_point("schedule", __name__)
