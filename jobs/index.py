"""Entry point of the index job: ``./spark-submit.sh jobs/index.py [--once] ...``.

Index messages by key and uniq key. The job is declared in :mod:`engine.spark.jobs.registry` and
lives in ``engine/spark/jobs/index.py``; ``run_index`` and ``IndexStats`` are re-exported here for
notebooks and scripts.
"""

import sys
from collections.abc import Sequence

from engine.spark.jobs.index import IndexStats, run_index
from engine.spark.jobs.registry import main as _main

__all__ = ["IndexStats", "main", "run_index"]


def main(argv: Sequence[str] | None = None) -> int:
    return _main("index", argv)


if __name__ == "__main__":
    sys.exit(main())
