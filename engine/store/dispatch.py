"""Dispatch: commit-log rows -> consume-queue entries, exactly once.

The consume queue records, in each commit, the last commit-log version it covers (a Delta app
transaction, app id :data:`DISPATCH_APP`) and every queue's next offset (commitInfo ``mq.cq``).
Rows of versions already covered are dropped, so a replayed or restarted micro-batch adds nothing,
whatever the stream's checkpoint says. Entries must continue each queue densely; a gap is a bug
upstream and stops the job rather than writing a hole.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from engine.errors import CommitConflictError, StoreError
from engine.model import UNDISPATCHED_FLAGS
from engine.store import schemas
from engine.store.log import VERSION_COLUMN, read_versions
from engine.store.marks import CQ_KEY, queue_marks
from engine.store.store import Store

DISPATCH_APP = "mq.dispatch"


def dispatched_version(store: Store, handle: DeltaTable | None = None) -> int:
    """Last commit-log version whose rows are in the consume queue (-1 before any)."""
    dt = handle if handle is not None else store.table(schemas.CONSUME_QUEUE)
    version = dt.transaction_version(DISPATCH_APP)
    return -1 if version is None else int(version)


def _entries(rows: pa.Table, dt: DeltaTable) -> tuple[pa.Table, int, str]:
    """Consume-queue rows for new commit-log rows, the covered version, and the new marks, all
    decided from the one snapshot ``dt``."""
    version = dt.transaction_version(DISPATCH_APP)
    last = -1 if version is None else int(version)
    marks = queue_marks(dt)
    rows = rows.filter(pc.greater(rows[VERSION_COLUMN], last))
    if rows.num_rows == 0:
        return schemas.CONSUME_QUEUE_SCHEMA.empty_table(), last, marks.to_json()
    covered = int(pc.max(rows[VERSION_COLUMN]).as_py())
    flags = pa.array(sorted(UNDISPATCHED_FLAGS), pa.int32())
    rows = rows.filter(pc.invert(pc.is_in(rows["sys_flag"], value_set=flags)))
    rows = rows.sort_by([(VERSION_COLUMN, "ascending"), ("physical_offset", "ascending")])
    topics = rows["topic"].to_pylist()
    qids = rows["queue_id"].to_pylist()
    offsets = rows["queue_offset"].to_pylist()
    keep = []
    for i, (topic, qid, off) in enumerate(zip(topics, qids, offsets, strict=True)):
        expected = marks.max_offset(topic, qid)
        if off < expected:
            continue  # already dispatched by an earlier writer of the same version range
        if off > expected:
            raise StoreError(
                f"dispatch found a gap in {topic}:{qid}: expected queue offset {expected}, got {off}",
                topic=topic,
                queue_id=qid,
                offset=off,
            )
        marks.set_next(topic, qid, off + 1)
        keep.append(i)
    rows = rows.take(pa.array(keep, pa.int64()))
    marks.log_version = covered
    entries = pa.table(
        {
            "topic": rows["topic"],
            "queue_id": rows["queue_id"],
            "queue_offset": rows["queue_offset"],
            "physical_offset": rows["physical_offset"],
            "size": rows["size"],
            "tags_code": rows["tags_code"],
            "store_ts_ms": rows["store_ts_ms"],
            "log_version": rows[VERSION_COLUMN],
        },
        schema=schemas.CONSUME_QUEUE_SCHEMA,
    )
    return entries, covered, marks.to_json()


def dispatch_rows(store: Store, rows: pa.Table, attempts: int = 8) -> int:
    """Append consume-queue entries for commit-log rows carrying ``_version``; returns entries added.

    Idempotent per commit-log version: called twice with the same rows, it adds them once.
    Safe against a concurrent dispatcher (the losing commit re-evaluates).

    Raises:
        StoreError: a queue-offset gap, or a write failure.
        CommitConflictError: lost ``attempts`` races in a row.
    """
    for _ in range(attempts):
        # A private snapshot: what is written is decided from exactly the version it commits after.
        dt = store.open_table(schemas.CONSUME_QUEUE)
        entries, covered, marks = _entries(rows, dt)
        if covered <= dispatched_version(store, dt) and entries.num_rows == 0:
            return 0
        try:
            store.append(
                schemas.CONSUME_QUEUE,
                entries,
                app_id=DISPATCH_APP,
                app_version=covered,
                custom_metadata={CQ_KEY: marks},
                max_retries=0,
                handle=dt,
            )
        except CommitConflictError:
            continue
        return int(entries.num_rows)
    raise CommitConflictError("dispatch lost every race for the consume queue", table=schemas.CONSUME_QUEUE)


def dispatch_pending(store: Store, max_versions: int = 1000) -> int:
    """Dispatch every committed commit-log version not yet dispatched, without Spark.

    The same reading and committing the Spark dispatch job (``jobs/dispatch.py``) does on its driver
    each micro-batch, without the streaming query around it: for tools and tests. Returns the number
    of entries added.
    """
    total = 0
    latest = store.version(schemas.COMMIT_LOG)
    start = dispatched_version(store) + 1
    while start <= latest:
        end = min(latest, start + max_versions - 1)
        rows = read_versions(
            store.uri(schemas.COMMIT_LOG), start, end, schemas.COMMIT_LOG_SCHEMA, store.storage_options
        )
        total += dispatch_rows(store, rows)
        # Versions with nothing to dispatch (only transaction halves) leave no marker; move on anyway.
        start = end + 1
    return total
