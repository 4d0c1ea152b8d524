"""Entry point of the dispatch job: ``./spark-submit.sh jobs/dispatch.py [--once] ...``.

Dispatch commit-log messages into the consume queue. The job is declared in
:mod:`engine.spark.jobs.registry` and lives in ``engine/spark/jobs/dispatch.py``; ``run_dispatch``
and ``DispatchStats`` are re-exported here for notebooks and scripts.
"""

import sys
from collections.abc import Sequence

from engine.spark.jobs.dispatch import DispatchStats, run_dispatch
from engine.spark.jobs.registry import main as _main

__all__ = ["DispatchStats", "main", "run_dispatch"]


def main(argv: Sequence[str] | None = None) -> int:
    return _main("dispatch", argv)


if __name__ == "__main__":
    sys.exit(main())
