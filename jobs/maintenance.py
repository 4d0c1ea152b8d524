"""Entry point of the maintenance job: ``./spark-submit.sh jobs/maintenance.py [--once] ...``.

Compact, checkpoint, expire and vacuum a store's tables. The job is declared in
:mod:`engine.spark.jobs.registry` and lives in ``engine/spark/jobs/maintenance.py``;
``run_maintenance`` and ``PassOptions`` are re-exported here for notebooks and scripts.
"""

import sys
from collections.abc import Sequence

from engine.spark.jobs.maintenance import PassOptions, run_maintenance
from engine.spark.jobs.registry import main as _main

__all__ = ["PassOptions", "main", "run_maintenance"]


def main(argv: Sequence[str] | None = None) -> int:
    return _main("maintenance", argv)


if __name__ == "__main__":
    sys.exit(main())
