"""The pull log: ``action_log`` PULL rows -> ``pull_log`` rows, exactly once per action-log version.

As QMQ's pull log, each consumer of a group gets a dense sequence of what it pulled: pull sequence
0, 1, 2, … -> (topic, queue_id, queue_offset, physical_offset), in the order the pulls were
committed (action-log version, then the consumer's own action sequence).

Exactly once: every ``pull_log`` commit carries the last action-log version it covers and the next
pull sequence of every consumer (see :mod:`engine.store.pull_log`). Commits are made with automatic
retries disabled, so two builders racing for the same version cannot both win: the loser re-reads
the marks and the covered version and drops what the winner already wrote. A replayed micro-batch is
therefore a no-op.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from engine.errors import CommitConflictError
from engine.protocol.actions import PULL
from engine.store import schemas
from engine.store.delta_log import VERSION_COLUMN
from engine.store.pull_log import (
    Marks,
    commit_pulls,
    covered_version,
    private_store,
    pulled_version,
    read_marks,
)
from engine.store.store import Store

# What the builder reads from an action-log row.
PULL_LOG_SOURCE_COLUMNS = (
    "group",
    "consumer_id",
    "sequence",
    "action",
    "topic",
    "queue_id",
    "queue_offset",
    "physical_offset",
    "ts_ms",
)


def pull_rows(actions: pa.Table, marks: Marks) -> pa.Table:
    """Pull-log rows for the PULL actions among ``actions`` (which carry ``_version``).

    Pure: ``marks`` (group -> consumer -> next pull sequence) is advanced in place.
    """
    pulls = actions.filter(pc.equal(actions["action"], PULL))
    if pulls.num_rows == 0:
        return schemas.PULL_LOG_SCHEMA.empty_table()
    pulls = pulls.sort_by([(VERSION_COLUMN, "ascending"), ("sequence", "ascending")])
    groups = pulls["group"].to_pylist()
    consumers = pulls["consumer_id"].to_pylist()
    sequences = []
    for group, consumer in zip(groups, consumers, strict=True):
        per_group = marks.setdefault(group, {})
        nxt = per_group.get(consumer, 0)
        sequences.append(nxt)
        per_group[consumer] = nxt + 1
    return pa.table(
        {
            "group": pulls["group"],
            "consumer_id": pulls["consumer_id"],
            "pull_sequence": pa.array(sequences, pa.int64()),
            "topic": pulls["topic"],
            "queue_id": pulls["queue_id"],
            "queue_offset": pulls["queue_offset"],
            "physical_offset": pulls["physical_offset"],
            "ts_ms": pulls["ts_ms"],
        },
        schema=schemas.PULL_LOG_SCHEMA,
    )


def build_pull_log_rows(
    store: Store, actions: pa.Table, *, through_version: int | None = None, attempts: int = 16
) -> int:
    """Append pull-log rows for action-log rows carrying ``_version``; returns the rows added.

    Idempotent per action-log version: rows of versions already covered are dropped, so calling it
    twice with the same rows adds them once. Safe against a concurrent builder.

    Args:
        store: the store.
        actions: action-log rows with ``_version`` (any actions; only PULL rows make pull-log rows).
        through_version: the last action-log version these rows cover (default: their largest
            ``_version``); lets a caller move past versions that hold no rows.
        attempts: commits tried before giving up on a race.

    Raises:
        CommitConflictError: lost ``attempts`` races in a row (retryable; nothing written).
        StoreError: the write failed.
    """
    if through_version is None:
        if actions.num_rows == 0:
            return 0
        through_version = int(pc.max(actions[VERSION_COLUMN]).as_py())
    writer, lock = private_store(store)
    with lock:
        for _ in range(attempts):
            # One handle for the read and the commit: the commit lands on exactly the next version of
            # what was read (retries disabled), or fails and the loop reads again.
            snapshot = writer.shared(schemas.PULL_LOG)
            last = covered_version(snapshot)
            if through_version <= last:
                return 0
            fresh = actions.filter(pc.greater(actions[VERSION_COLUMN], last))
            marks = read_marks(snapshot)
            rows = pull_rows(fresh, marks)
            try:
                commit_pulls(writer, rows, through_version, marks)
            except CommitConflictError:
                continue
            return int(rows.num_rows)
    raise CommitConflictError("pull-log builder lost every race for the pull log", table=schemas.PULL_LOG)


def build_pull_log(store: Store, max_versions: int = 1000) -> int:
    """Build the pull log from every action-log version not yet covered, without Spark.

    The Spark job (``jobs/pull_log.py``) is the production path; this is the same logic for tools and
    tests. Returns the number of pull-log rows added.
    """
    columns = pa.schema([schemas.ACTION_LOG_SCHEMA.field(c) for c in PULL_LOG_SOURCE_COLUMNS])
    chunks = store.versions_after(
        schemas.ACTION_LOG, pulled_version(store), columns, max_versions=max_versions
    )
    return sum(build_pull_log_rows(store, rows, through_version=last) for rows, last in chunks)
