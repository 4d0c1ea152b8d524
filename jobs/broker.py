"""Every broker job in one Spark application: ``./spark-submit.sh jobs/broker.py [--once] [--jobs ...]``.

The app is :mod:`engine.spark.jobs.broker_app`; the jobs it runs are those of
:mod:`engine.spark.jobs.registry`.
"""

import sys

from engine.spark.jobs.broker_app import main, run_forever, run_once
from engine.spark.jobs.registry import JOB_ORDER

__all__ = ["JOB_ORDER", "main", "run_forever", "run_once"]

if __name__ == "__main__":
    sys.exit(main())
