"""spark-submit entry point of the job in engine/spark/jobs/transaction_check.py."""

from engine.spark.jobs.registry import entry_point
from engine.spark.jobs.transaction_check import CheckStats, run_transaction_check

__all__ = ["CheckStats", "main", "run_transaction_check"]  # re-exported for notebooks and scripts
main = entry_point("transaction_check", __name__)
