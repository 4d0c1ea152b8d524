"""The pull log: ``action_log`` PULL rows -> ``pull_log`` rows, exactly once per action-log version.

As QMQ's pull log, each consumer of a group gets a dense sequence of what it pulled: pull sequence
0, 1, 2, … -> (topic, queue_id, queue_offset, physical_offset), in the order the pulls were
committed (action-log version, then the consumer's own action sequence). A PULL row leasing the
range ``[queue_offset, end_offset)`` makes one pull-log row per offset of the range that the consume
queue still holds (physical offsets are looked up there).

Exactly once: every ``pull_log`` commit carries the last action-log version it covers and the next
pull sequence of every consumer (see :mod:`engine.store.pull_log`). Commits are made with automatic
retries disabled, so two builders racing for the same version cannot both win: the loser re-reads
the marks and the covered version and drops what the winner already wrote. A replayed micro-batch is
therefore a no-op.
"""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc

from engine.errors import CommitConflictError
from engine.protocol.actions import PULL
from engine.store import schemas
from engine.store.consume_queue import QueueIndex
from engine.store.delta import VERSION_COLUMN
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
    "end_offset",
)

# (topic, queue_id, start, end) -> {queue offset: physical offset} for the entries the queue holds.
Resolver = Callable[[str, int, int, int], dict[int, int]]


def queue_resolver(store: Store) -> Resolver:
    """A :data:`Resolver` reading the store's consume queue."""
    index = QueueIndex(store)
    index.refresh()

    def resolve(topic: str, queue_id: int, start: int, end: int) -> dict[int, int]:
        entries = index.entries(topic, queue_id, start, end)
        return dict(
            zip(entries["queue_offset"].to_pylist(), entries["physical_offset"].to_pylist(), strict=True)
        )

    return resolve


def _expand(pulls: pa.Table, resolve: Resolver | None) -> list[dict[str, object]]:
    """One row per leased offset: single-offset rows as they are, ranges through ``resolve``."""
    out: list[dict[str, object]] = []
    for row in pulls.to_pylist():
        end = row.get("end_offset")
        if end is None:
            out.append(row)
            continue
        if resolve is None:
            raise ValueError("a PULL row leasing a range needs a resolver of physical offsets")
        found = resolve(row["topic"], int(row["queue_id"]), int(row["queue_offset"]), int(end))
        out.extend({**row, "queue_offset": o, "physical_offset": found[o]} for o in sorted(found))
    return out


def pull_rows(actions: pa.Table, marks: Marks, resolve: Resolver | None = None) -> pa.Table:
    """Pull-log rows for the PULL actions among ``actions`` (which carry ``_version``).

    Pure but for ``resolve`` (needed when a PULL row leases a range): ``marks`` (group -> consumer
    -> next pull sequence) is advanced in place.
    """
    pulls = actions.filter(pc.equal(actions["action"], PULL))
    if pulls.num_rows == 0:
        return schemas.PULL_LOG_SCHEMA.empty_table()
    pulls = pulls.sort_by([(VERSION_COLUMN, "ascending"), ("sequence", "ascending")])
    rows = _expand(pulls, resolve) if "end_offset" in pulls.column_names else pulls.to_pylist()
    for row in rows:
        per_group = marks.setdefault(str(row["group"]), {})
        nxt = per_group.get(str(row["consumer_id"]), 0)
        row["pull_sequence"] = nxt
        per_group[str(row["consumer_id"])] = nxt + 1
    return pa.Table.from_pylist(
        [{f: r[f] for f in schemas.PULL_LOG_SCHEMA.names} for r in rows], schema=schemas.PULL_LOG_SCHEMA
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
    resolve = queue_resolver(store)
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
            rows = pull_rows(fresh, marks, resolve)
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
