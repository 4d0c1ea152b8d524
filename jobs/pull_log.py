"""Entry point of the pull_log job: ``./spark-submit.sh jobs/pull_log.py [--once] ...``.

Build each consumer's pull log from the action log. The job is declared in
:mod:`engine.spark.jobs.registry` and lives in ``engine/spark/jobs/pull_log.py``; ``run_pull_log``
and ``PullLogStats`` are re-exported here for notebooks and scripts.
"""

import sys
from collections.abc import Sequence

from engine.spark.jobs.pull_log import PullLogStats, run_pull_log
from engine.spark.jobs.registry import main as _main

__all__ = ["PullLogStats", "main", "run_pull_log"]


def main(argv: Sequence[str] | None = None) -> int:
    return _main("pull_log", argv)


if __name__ == "__main__":
    sys.exit(main())
