"""The pull log: ``action_log`` PULL rows -> ``pull_log`` rows, exactly once per action-log version.

As QMQ's pull log, each consumer of a group gets a dense sequence of what it pulled: pull sequence
0, 1, 2, … -> (topic, queue_id, queue_offset, physical_offset), in the order the pulls were
committed (action-log version, then the consumer's own action sequence).

Exactly once: every ``pull_log`` commit carries a Delta app transaction (app id :data:`PULL_LOG_APP`,
version = the last action-log version it covers) and, in its commitInfo (:data:`MARKS_KEY`), the next
pull sequence of every consumer. Commits are made with automatic retries disabled, so two builders
racing for the same version cannot both win: the loser re-reads the marks and the covered version and
drops what the winner already wrote. A replayed micro-batch is therefore a no-op.
"""

from __future__ import annotations

import json
import threading
import weakref
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from engine.errors import CommitConflictError
from engine.protocol.actions import PULL
from engine.store import schemas
from engine.store.log import VERSION_COLUMN, read_versions, table_dataset
from engine.store.marks import latest_commit_value
from engine.store.store import Store

PULL_LOG_APP = "mq.pull_log"
MARKS_KEY = "mq.pl"
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

Marks = dict[str, dict[str, int]]  # group -> consumer_id -> next pull sequence

_writers: weakref.WeakKeyDictionary[Store, tuple[Store, threading.Lock]] = weakref.WeakKeyDictionary()
_writers_lock = threading.Lock()


def private_store(store: Store) -> tuple[Store, threading.Lock]:
    """A second handle set on ``store``'s tables, and the lock its user holds while reading and committing.

    The shared store's handles are refreshed by any of its users at any time; an optimistic
    read-then-commit-the-next-version needs a handle that stays at the version it read.
    """
    with _writers_lock:
        found = _writers.get(store)
        if found is None:
            found = (Store(store.root, store.storage_options, store.config), threading.Lock())
            _writers[store] = found
        return found


def pulled_version(store: Store) -> int:
    """Last action-log version whose PULL rows are in the pull log (-1 before any)."""
    version = store.app_version(schemas.PULL_LOG, PULL_LOG_APP)
    return -1 if version is None else version


def _covered(dt: DeltaTable) -> int:
    version = dt.transaction_version(PULL_LOG_APP)
    return -1 if version is None else int(version)


def read_marks(dt: DeltaTable) -> Marks:
    """Next pull sequence of every consumer, as of the pull log version ``dt`` has loaded.

    Taken from the newest commit that carries marks (compaction commits do not); if the log no longer
    has one, rebuilt by scanning that snapshot.
    """
    if int(dt.version()) == 0:
        return {}
    raw = latest_commit_value(dt, MARKS_KEY)
    if raw is not None:
        data: Any = json.loads(raw)
        return {g: {c: int(n) for c, n in consumers.items()} for g, consumers in data.items()}
    table = table_dataset(dt).to_table(columns=["group", "consumer_id", "pull_sequence"])
    marks: Marks = {}
    if table.num_rows:
        grouped = table.group_by(["group", "consumer_id"]).aggregate([("pull_sequence", "max")])
        for row in grouped.to_pylist():
            marks.setdefault(row["group"], {})[row["consumer_id"]] = int(row["pull_sequence_max"]) + 1
    return marks


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
            dt = writer.table(schemas.PULL_LOG)
            last = _covered(dt)
            if through_version <= last:
                return 0
            fresh = actions.filter(pc.greater(actions[VERSION_COLUMN], last))
            marks = read_marks(dt)
            rows = pull_rows(fresh, marks)
            try:
                writer.append(
                    schemas.PULL_LOG,
                    rows,
                    app_id=PULL_LOG_APP,
                    app_version=through_version,
                    custom_metadata={MARKS_KEY: json.dumps(marks, separators=(",", ":"), sort_keys=True)},
                    max_retries=0,
                )
            except CommitConflictError:
                continue
            return int(rows.num_rows)
    raise CommitConflictError("pull-log builder lost every race for the pull log", table=schemas.PULL_LOG)


def build_pull_log(store: Store, max_versions: int = 1000) -> int:
    """Build the pull log from every action-log version not yet covered, without Spark.

    The Spark job (``jobs/pull_log.py``) is the production path; this is the same logic for tools and
    tests. Returns the number of pull-log rows added.
    """
    total = 0
    latest = store.version(schemas.ACTION_LOG)
    start = pulled_version(store) + 1
    columns = [schemas.ACTION_LOG_SCHEMA.field(c) for c in PULL_LOG_SOURCE_COLUMNS]
    while start <= latest:
        end = min(latest, start + max_versions - 1)
        rows = read_versions(
            store.uri(schemas.ACTION_LOG), start, end, pa.schema(columns), store.storage_options
        )
        total += build_pull_log_rows(store, rows, through_version=end)
        start = end + 1
    return total
