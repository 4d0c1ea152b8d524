"""The pull-log job: action_log PULL rows -> pull_log, as a Spark structured-streaming query.

The query is triggered by new action-log commits (:func:`~engine.spark.jobs.streams.run_log_job`:
Delta's streaming source, or ``deltalog`` without Delta); the action-log rows of every version not
yet covered go to :func:`engine.broker.pull_log.build_pull_log_rows`, which commits
the pull-log rows together with a Delta app transaction recording the last action-log version
covered (app id ``mq.pull_log``). A replayed micro-batch (a restart, a lost checkpoint, a second
builder) therefore adds nothing: exactly once, whatever the checkpoint says.
"""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa

from engine.broker.pull_log import PULL_LOG_SOURCE_COLUMNS, build_pull_log_rows
from engine.spark.jobs.stats import JobStats
from engine.spark.jobs.streams import LogJob
from engine.store import schemas
from engine.store.pull_log import pulled_version
from engine.store.store import Store


class PullLogStats(JobStats):
    """Micro-batches, action-log rows read and pull-log rows written by one run."""

    COUNTERS = ("batches", "actions", "pulls")


def pull_log_batches(store: Store, stats: JobStats) -> Callable[[pa.Table], None]:
    """The pull-log job's micro-batch: its PULL actions into the pull log."""

    def build_batch(rows: pa.Table) -> None:
        # Idempotent per action-log version, so a replayed batch adds nothing.
        pulls = build_pull_log_rows(store, rows) if rows.num_rows else 0
        stats.count(batches=1, actions=rows.num_rows, pulls=pulls)

    return build_batch


PULL_LOG_JOB = LogJob(
    name="pull_log",
    table=schemas.ACTION_LOG,
    columns=PULL_LOG_SOURCE_COLUMNS,
    covered=pulled_version,
    handler=pull_log_batches,
    stats=PullLogStats,
    trigger_ms=1000,
    output=schemas.PULL_LOG,
    line=(
        "pull_log: {pulls} pull-log rows from {actions} action-log rows in {batches} batches "
        "({elapsed_s:.1f}s); pull_log version {version}, action_log covered through version {covered}"
    ),
)
run_pull_log = PULL_LOG_JOB.run
