"""Entry point of the transaction_check job: ``./spark-submit.sh jobs/transaction_check.py [--once] ...``.

Check back undecided transactional messages. The job is declared in
:mod:`engine.spark.jobs.registry` and lives in ``engine/spark/jobs/transaction_check.py``;
``run_transaction_check`` and ``CheckStats`` are re-exported here for notebooks and scripts.
"""

import sys
from collections.abc import Sequence

from engine.spark.jobs.registry import main as _main
from engine.spark.jobs.transaction_check import CheckStats, run_transaction_check

__all__ = ["CheckStats", "main", "run_transaction_check"]


def main(argv: Sequence[str] | None = None) -> int:
    return _main("transaction_check", argv)


if __name__ == "__main__":
    sys.exit(main())
