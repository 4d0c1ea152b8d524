"""Entry point of the schedule job: ``./spark-submit.sh jobs/schedule.py [--once] ...``.

Deliver due delayed and timer messages. The job is declared in :mod:`engine.spark.jobs.registry` and
lives in ``engine/spark/jobs/schedule.py``; ``run_schedule`` and ``ScheduleStats`` are re-exported
here for notebooks and scripts.
"""

import sys
from collections.abc import Sequence

from engine.spark.jobs.registry import main as _main
from engine.spark.jobs.schedule import ScheduleStats, run_schedule

__all__ = ["ScheduleStats", "main", "run_schedule"]


def main(argv: Sequence[str] | None = None) -> int:
    return _main("schedule", argv)


if __name__ == "__main__":
    sys.exit(main())
