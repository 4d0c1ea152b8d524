"""The pull-log job: action_log PULL rows -> pull_log, as a Spark structured-streaming query.

The source is the action log read through the ``deltalog`` data source from the first version not yet
covered; each micro-batch goes to :func:`engine.broker.pull_log.build_pull_log_rows`, which commits
the pull-log rows together with a Delta app transaction recording the last action-log version
covered (app id ``mq.pull_log``). A replayed micro-batch (a restart, a lost checkpoint, a second
builder) therefore adds nothing: exactly once, whatever the checkpoint says.

Usage::

    python jobs/pull_log.py --store ./mqdata --once     # build from what is committed, then exit
    ./spark-submit.sh jobs/pull_log.py --store ./mqdata  # run until SIGTERM / Ctrl-C
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from engine.broker.pull_log import PULL_LOG_SOURCE_COLUMNS, build_pull_log_rows
from engine.spark.jobs.stats import JobStats
from engine.spark.jobs.streams import run_log_job
from engine.store import schemas
from engine.store.pull_log import pulled_version
from engine.store.store import Store

JOB = "pull_log"
TRIGGER_MS = 1000


@dataclass
class PullLogStats(JobStats):
    """Progress of one run of the job (updated on the driver, once per micro-batch)."""

    batches: int = 0
    actions: int = 0
    pulls: int = 0

    def add(self, actions: int, pulls: int) -> None:
        self.count(batches=1, actions=actions, pulls=pulls)


def run_pull_log(
    spark: Any,
    store: Store,
    *,
    once: bool = True,
    checkpoint: str | None = None,
    stats: PullLogStats | None = None,
    trigger_ms: int = TRIGGER_MS,
) -> Any:
    """Start the pull-log query on ``spark`` for ``store`` (action log PULL rows -> pull log).

    The arguments, result and errors are those of every job's ``run``
    (:class:`~engine.spark.jobs.registry.Job`); ``trigger_ms`` is the processing-time trigger of a
    running query.
    """
    counters = stats if stats is not None else PullLogStats()

    def build_batch(rows: pa.Table) -> None:
        # Idempotent per action-log version, so a replayed batch adds nothing.
        pulls = build_pull_log_rows(store, rows) if rows.num_rows else 0
        counters.add(rows.num_rows, pulls)

    return run_log_job(
        spark,
        store,
        job=JOB,
        table=schemas.ACTION_LOG,
        columns=PULL_LOG_SOURCE_COLUMNS,
        handler=build_batch,
        marker=lambda: pulled_version(store),
        once=once,
        checkpoint=checkpoint,
        trigger_ms=trigger_ms,
    )


def summary(store: Store, stats: PullLogStats, elapsed_s: float) -> str:
    """The one line a run ends with."""
    return (
        f"pull_log: {stats.pulls} pull-log rows from {stats.actions} action-log rows in "
        f"{stats.batches} batches ({elapsed_s:.1f}s); pull_log version {store.version(schemas.PULL_LOG)}, "
        f"action_log covered through version {pulled_version(store)}"
    )
