"""Entry point of the retry job: ``./spark-submit.sh jobs/retry.py [--once] ...``.

Route NACKed messages to retry topics and dead-letter queues. The job is declared in
:mod:`engine.spark.jobs.registry` and lives in ``engine/spark/jobs/retry.py``; ``run_retry`` and
``RetryStats`` are re-exported here for notebooks and scripts.
"""

import sys
from collections.abc import Sequence

from engine.spark.jobs.registry import main as _main
from engine.spark.jobs.retry import RetryStats, run_retry

__all__ = ["RetryStats", "main", "run_retry"]


def main(argv: Sequence[str] | None = None) -> int:
    return _main("retry", argv)


if __name__ == "__main__":
    sys.exit(main())
