"""Optimistic sequencing of the commit log on the Delta log itself.

Every commit to ``commit_log`` carries, in its commitInfo (``mq.hwm``), the high-water marks after
it: the next physical offset, the last store time and the next queue offset of every queue. A writer
stamps its batch from the marks of the version it read, then commits exactly the next version with
automatic retries disabled. If another writer took that version, it catches up from the newer
commit's marks and stamps again. The Delta log is the lock: no offset is assigned twice and queue
offsets stay dense, however many processes append.

On a local store, writers of one host also queue on an advisory lock (``flock`` on
``<store>/_locks/commit_log.lock``) held from catch-up to commit, so they take turns instead of
racing: a lost race costs a rewritten data file and a snapshot refresh, and under contention the
writer that just won (its snapshot current) tends to win again, starving the others. The lock is
only an optimization: the optimistic protocol above stays the correctness mechanism (writers on
other hosts or object stores, maintenance commits, and writers with the lock turned off with
``MQ_SEQUENCER_LOCK=0`` still race and retry). The kernel drops a dead process's lock at once; a
stopped holder delays the others at most ``LOCK_WAIT_S`` (:mod:`engine.store.hostlock`), after
which they append without it.

A lost race rewrites the batch's data file: the offsets are columns of the rows (the table is
self-describing, DESIGN.md §2), so there is no cheaper re-stamp that keeps files readable by any
Delta reader. With the lock, only writers of other hosts and maintenance commits still cause it.

What an append costs is mostly delta-rs's, and grows with two things (``bench/commit_cost.py``):
the table's live data files, mildly (one message: about 4 ms at 50 files, 10-15 ms at 2000 on the
2-core bench machine), and the number of versions the writer's DeltaTable handle has moved on by
since it was opened, steeply (the handle keeps one more Arrow batch of file actions per version and
every commit goes over all of them: 4 ms fresh, 42 ms after 400 versions). The writer therefore
reopens its handle every :data:`RENEW_HANDLE_VERSIONS` versions. Refreshing a snapshot by one
version costs about as much as an append, so lost races are expensive.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import (
    ColumnProperties,
    CommitProperties,
    DeltaTable,
    PostCommitHookProperties,
    Transaction,
    WriterProperties,
    write_deltalake,
)
from deltalake.exceptions import CommitFailedError, DeltaError

from engine.errors import CommitConflictError, CommitStateUnknownError, StoreError
from engine.model import UNDISPATCHED_FLAGS
from engine.protocol import record_size, tags_code
from engine.store import schemas
from engine.store.hostlock import LOCK_DIR, LOCK_WAIT_S, HostLock, host_lock_enabled
from engine.store.log import table_dataset
from engine.store.marks import latest_commit_value
from engine.store.store import RENEW_HANDLE_COMMITS, Store, now_ms

HWM_KEY = "mq.hwm"
# App transactions whose ids start with this are one-shot guards (a transaction's decision,
# ``mq.tx.<half offset>``): they carry ``lastUpdated`` and expire after the commit log's
# ``delta.setTransactionRetentionDuration`` (:data:`engine.store.store.TXN_RETENTION`, 7 days).
# Every other app id is a job's progress marker: it carries no ``lastUpdated`` and never expires,
# because an expired marker would read as "nothing done yet" and make the job redo its history.
EXPIRING_APP_PREFIX = "mq.tx."
_NO_PROPERTIES: Mapping[str, str] = MappingProxyType({})
BATCH_KEY = "mq.batch"


@dataclass
class HighWaterMarks:
    """Next offsets after a given commit-log version."""

    physical: int = 0
    store_ts_ms: int = 0
    queues: dict[str, list[int]] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(
            {"p": self.physical, "t": self.store_ts_ms, "q": self.queues}, separators=(",", ":")
        )

    @classmethod
    def from_json(cls, text: str) -> HighWaterMarks:
        data = json.loads(text)
        return cls(
            int(data.get("p", 0)), int(data.get("t", 0)), {k: list(v) for k, v in data.get("q", {}).items()}
        )

    def copy(self) -> HighWaterMarks:
        return HighWaterMarks(self.physical, self.store_ts_ms, {k: list(v) for k, v in self.queues.items()})

    def next_queue_offset(self, topic: str, queue_id: int) -> int:
        offsets = self.queues.get(topic)
        return offsets[queue_id] if offsets is not None and queue_id < len(offsets) else 0


class PendingMessage(NamedTuple):
    """A validated message waiting for its offsets (a tuple: batches hold many of them)."""

    topic: str
    queue_id: int
    body: bytes
    uniq_key: str
    tags: str | None = None
    keys: tuple[str, ...] = ()
    properties: Mapping[str, str] = _NO_PROPERTIES
    born_ts_ms: int = 0
    sys_flag: int = 0
    delay_level: int = 0
    deliver_at_ms: int | None = None
    reconsume_times: int = 0
    tags_code: int | None = None  # override (schedule topic keeps the due time here)


class Stamped(NamedTuple):
    """Offsets given to one message by a successful commit."""

    msg_id: str
    uniq_key: str
    topic: str
    queue_id: int
    queue_offset: int
    physical_offset: int
    store_ts_ms: int
    version: int


def read_hwm(dt: DeltaTable) -> HighWaterMarks:
    """High-water marks as of ``dt``'s loaded version.

    Walks back from that version to the newest commit that carries marks (compaction commits may
    not); if none is left in the log, recovers them by scanning the table.
    """
    text = latest_commit_value(dt, HWM_KEY)
    return HighWaterMarks.from_json(text) if text is not None else recover_hwm_by_scan(dt)


def recover_hwm_by_scan(dt: DeltaTable) -> HighWaterMarks:
    """Rebuild the marks from the rows themselves (slow; only when the log lost them)."""
    table = table_dataset(dt).to_table(
        columns=["physical_offset", "size", "topic", "queue_id", "queue_offset", "store_ts_ms"]
    )
    hwm = HighWaterMarks()
    if table.num_rows == 0:
        return hwm
    ends = pc.add(table["physical_offset"], pc.cast(table["size"], pa.int64()))
    hwm.physical = int(pc.max(ends).as_py())
    hwm.store_ts_ms = int(pc.max(table["store_ts_ms"]).as_py())
    grouped = table.group_by(["topic", "queue_id"]).aggregate([("queue_offset", "max")])
    for row in grouped.to_pylist():
        offsets = hwm.queues.setdefault(row["topic"], [])
        while len(offsets) <= row["queue_id"]:
            offsets.append(0)
        offsets[row["queue_id"]] = int(row["queue_offset_max"]) + 1
    return hwm


# Small row groups let a pull read a few hundred rows instead of a whole micro-batch file.
COMMIT_LOG_ROW_GROUP_ROWS = 256
# Bodies are never filtered on and rarely repeat: no dictionary attempt and no page statistics for
# them (both cost CPU on every write and buy nothing).
_WRITER_PROPERTIES = WriterProperties(
    max_row_group_size=COMMIT_LOG_ROW_GROUP_ROWS,
    column_properties={"body": ColumnProperties(dictionary_enabled=False, statistics_enabled="NONE")},
)
# Checkpoints are written after the host lock is released (see CommitLogWriter.append): a
# checkpoint of a table of many small files takes longer than the commit it follows.
_NO_HOOKS = PostCommitHookProperties(create_checkpoint=False, cleanup_expired_logs=False)
DEFAULT_CHECKPOINT_INTERVAL = 100  # Delta's default delta.checkpointInterval
# The writer renews its handle once it has moved on by this many versions: see RENEW_HANDLE_COMMITS
# (on a 50-file commit log: 4 ms per append on a fresh handle, 42 ms after 400 versions, 12 ms on a
# fresh handle of the same table grown to 490 files).
RENEW_HANDLE_VERSIONS = RENEW_HANDLE_COMMITS

_OFFSET_FREE = [
    f
    for f in schemas.COMMIT_LOG_SCHEMA
    if f.name not in ("physical_offset", "queue_offset", "msg_id", "store_ts_ms")
]
_OFFSET_FREE_SCHEMA = pa.schema(_OFFSET_FREE)


_EMPTY_STRINGS = pa.array([], pa.string())


def _empty_lists(n: int) -> pa.Array:
    """``n`` empty ``keys`` lists, without a Python list per row."""
    return pa.ListArray.from_arrays(pa.array(np.zeros(n + 1, dtype=np.int32)), _EMPTY_STRINGS)


def _empty_maps(n: int) -> pa.Array:
    """``n`` empty ``properties`` maps, without a Python list per row."""
    return pa.MapArray.from_arrays(pa.array(np.zeros(n + 1, dtype=np.int32)), _EMPTY_STRINGS, _EMPTY_STRINGS)


def _tags_codes(tags: Sequence[str | None]) -> list[int]:
    codes = {t: tags_code(t) for t in set(tags)}  # a batch has few distinct tags
    return [codes[t] for t in tags]


@dataclass(frozen=True)
class PendingBatch:
    """Messages waiting for offsets, in columns: the offset-free columns are built once per batch,
    however many times a lost race makes the batch be stamped again."""

    columns: pa.Table  # the commit-log columns that do not depend on offsets
    topics: list[str]
    queue_ids: list[int]
    dispatched: list[bool]
    uniq_keys: list[str]
    born_unset: bool = False  # some born_ts_ms are 0: stamped with the store time

    @property
    def num_rows(self) -> int:
        return int(self.columns.num_rows)

    @classmethod
    def of(cls, messages: Sequence[PendingMessage]) -> PendingBatch:
        n = len(messages)
        if not n:
            return cls(_OFFSET_FREE_SCHEMA.empty_table(), [], [], [], [])
        # One transposition instead of a pass over the messages per column.
        (topics, qids, bodies, uniq, tags, keys, props, born, flags, levels, deliver, reconsume, codes) = (
            list(column) for column in zip(*messages, strict=True)
        )
        header = {t: record_size(t, 0, _NO_PROPERTIES) for t in set(topics)}
        has_props = any(props)
        if has_props:
            sizes = [
                record_size(t, len(b), p) if p else header[t] + len(b)
                for t, b, p in zip(topics, bodies, props, strict=True)
            ]
        else:
            sizes = [header[t] + len(b) for t, b in zip(topics, bodies, strict=True)]
        if any(c is not None for c in codes):
            tag_codes = [c if c is not None else tags_code(t) for c, t in zip(codes, tags, strict=True)]
        else:
            tag_codes = _tags_codes(tags)
        cols = {
            "topic": pa.array(topics, pa.string()),
            "queue_id": pa.array(qids, pa.int32()),
            "uniq_key": pa.array(uniq, pa.string()),
            "tags": pa.array(tags, pa.string()),
            "tags_code": pa.array(tag_codes, pa.int64()),
            "keys": pa.array(keys, pa.list_(pa.string())) if any(keys) else _empty_lists(n),
            "properties": (
                pa.array([list(p.items()) for p in props], pa.map_(pa.string(), pa.string()))
                if has_props
                else _empty_maps(n)
            ),
            "body": pa.array(bodies, pa.binary()),
            "size": pa.array(sizes, pa.int32()),
            "born_ts_ms": pa.array(born, pa.int64()),
            "sys_flag": pa.array(flags, pa.int32()),
            "delay_level": pa.array(levels, pa.int32()),
            "deliver_at_ms": pa.array(deliver, pa.int64()),
            "reconsume_times": pa.array(reconsume, pa.int32()),
        }
        dispatched = [f not in UNDISPATCHED_FLAGS for f in flags]
        return cls(_offset_free_table(cols), topics, qids, dispatched, uniq, 0 in born)

    @classmethod
    def single_queue(
        cls,
        topic: str,
        queue_id: int,
        bodies: list[bytes],
        uniq_keys: list[str],
        tags: list[str | None],
        keys: list[list[str]] | None,
        properties: list[list[tuple[str, str]]] | None,
        born_ts_ms: int,
    ) -> PendingBatch:
        """A plain batch for one queue, built column by column (RocketMQ's batch send).

        ``keys`` / ``properties`` of None mean no message has any.
        """
        n = len(bodies)
        body_array = pa.array(bodies, pa.binary())
        header = record_size(topic, 0, _NO_PROPERTIES)
        sizes = pc.add(pc.binary_length(body_array).cast(pa.int64()), header)
        if properties is not None and any(properties):
            extra = [len("".join(f"{k}\x01{v}\x02" for k, v in p).encode()) for p in properties]
            sizes = pc.add(sizes, pa.array(extra, pa.int64()))
        zeros = pa.array(np.zeros(n, dtype=np.int32))
        cols = {
            "topic": pa.array([topic] * n, pa.string()),
            "queue_id": pa.array(np.full(n, queue_id, dtype=np.int32)),
            "uniq_key": pa.array(uniq_keys, pa.string()),
            "tags": pa.array(tags, pa.string()),
            "tags_code": pa.array(_tags_codes(tags), pa.int64()),
            "keys": pa.array(keys, pa.list_(pa.string())) if keys is not None else _empty_lists(n),
            "properties": (
                pa.array(properties, pa.map_(pa.string(), pa.string()))
                if properties is not None
                else _empty_maps(n)
            ),
            "body": body_array,
            "size": sizes.cast(pa.int32()),
            "born_ts_ms": pa.array(np.full(n, born_ts_ms, dtype=np.int64)),
            "sys_flag": zeros,
            "delay_level": zeros,
            "deliver_at_ms": pa.nulls(n, pa.int64()),
            "reconsume_times": zeros,
        }
        return cls(
            _offset_free_table(cols), [topic] * n, [queue_id] * n, [True] * n, uniq_keys, born_ts_ms == 0
        )


def _offset_free_table(cols: dict[str, pa.Array]) -> pa.Table:
    return pa.Table.from_arrays([cols[f.name] for f in _OFFSET_FREE], schema=_OFFSET_FREE_SCHEMA)


def stamp(
    messages: Sequence[PendingMessage] | PendingBatch, hwm: HighWaterMarks, store_id: str, ts_ms: int
) -> tuple[pa.Table, StampedBatch, HighWaterMarks]:
    """Give each message its offsets, in order; returns the rows, the results and the new marks.

    Pure: the caller commits the rows and keeps the marks only if the commit wins. Columnar: this is
    the produce hot path.
    """
    batch = messages if isinstance(messages, PendingBatch) else PendingBatch.of(messages)
    after = hwm.copy()
    store_ts = max(ts_ms, hwm.store_ts_ms)
    after.store_ts_ms = store_ts
    n = batch.num_rows
    sizes = batch.columns["size"].to_numpy().astype(np.int64)
    physical = np.empty(n, dtype=np.int64)
    if n:
        np.cumsum(sizes, out=physical)
        physical -= sizes
        physical += after.physical
        after.physical += int(sizes.sum())
    queues = after.queues
    topics, qids = batch.topics, batch.queue_ids
    if n and all(batch.dispatched) and topics.count(topics[0]) == n and qids.count(qids[0]) == n:
        offsets = queues.setdefault(topics[0], [])
        while len(offsets) <= qids[0]:
            offsets.append(0)
        first = offsets[qids[0]]
        offsets[qids[0]] = first + n
        queue_offsets: list[int] = list(range(first, first + n))
    else:
        queue_offsets = []
        for topic, qid, dispatched in zip(topics, qids, batch.dispatched, strict=True):
            if not dispatched:
                queue_offsets.append(-1)
                continue
            offsets = queues.setdefault(topic, [])
            while len(offsets) <= qid:
                offsets.append(0)
            queue_offsets.append(offsets[qid])
            offsets[qid] += 1
    prefix = store_id.upper()
    physical_list = physical.tolist()
    msg_ids = [f"{prefix}{p:016X}" for p in physical_list]
    cols = batch.columns
    born = cols["born_ts_ms"]
    if batch.born_unset:
        born = pc.if_else(pc.equal(born, 0), store_ts, born)
    arrays = {
        "physical_offset": pa.array(physical),
        "queue_offset": pa.array(queue_offsets, pa.int64()),
        "msg_id": pa.array(msg_ids, pa.string()),
        "store_ts_ms": pa.array(np.full(n, store_ts, dtype=np.int64)),
        "born_ts_ms": born,
    }
    table = pa.Table.from_arrays(
        [arrays[name] if name in arrays else cols[name] for name in schemas.COMMIT_LOG_SCHEMA.names],
        schema=schemas.COMMIT_LOG_SCHEMA,
    )
    results = StampedBatch(msg_ids, batch.uniq_keys, topics, qids, queue_offsets, physical_list, store_ts)
    return table, results, after


@dataclass(frozen=True)
class StampedBatch:
    """Offsets given to a batch, in columns and input order; ``version`` is the commit's (-1 until
    it is known). Cheaper than a :class:`Stamped` per message where a batch is turned into results."""

    msg_ids: list[str]
    uniq_keys: list[str]
    topics: list[str]
    queue_ids: list[int]
    queue_offsets: list[int]
    physical: list[int]
    store_ts_ms: int
    version: int = -1

    def __len__(self) -> int:
        return len(self.msg_ids)

    def rows(self) -> list[Stamped]:
        ts, version = self.store_ts_ms, self.version
        return [
            Stamped(m, u, t, q, o, p, ts, version)
            for m, u, t, q, o, p in zip(
                self.msg_ids,
                self.uniq_keys,
                self.topics,
                self.queue_ids,
                self.queue_offsets,
                self.physical,
                strict=True,
            )
        ]


_NOTHING = StampedBatch([], [], [], [], [], [], 0)


def _transactions(txns: Mapping[str, int], now: int) -> list[Transaction] | None:
    return [
        Transaction(app, v, now) if app.startswith(EXPIRING_APP_PREFIX) else Transaction(app, v)
        for app, v in txns.items()
    ] or None


def _recorded(dt: DeltaTable, app_id: str) -> int:
    version = dt.transaction_version(app_id)
    return -1 if version is None else int(version)


class CommitLogWriter:
    """Appends batches to ``commit_log`` with sequenced offsets; one per process is enough.

    Thread-safe: batches from several threads are committed one after another. On a local store,
    writers of the host take turns on :class:`HostLock` (see the module docstring).

    Args:
        store: the store to append to.
        host_lock: take the inter-process lock around each append (local stores only); default
            ``MQ_SEQUENCER_LOCK`` (on unless ``0``).
        lock_wait_s: longest wait for the lock before an append goes ahead without it.
    """

    def __init__(
        self, store: Store, *, host_lock: bool | None = None, lock_wait_s: float = LOCK_WAIT_S
    ) -> None:
        self._store = store
        self._dt: DeltaTable | None = None
        self._hwm: HighWaterMarks | None = None
        self._lock = threading.Lock()
        use_lock = host_lock_enabled() if host_lock is None else host_lock
        self._host_lock = (
            HostLock(os.path.join(store.root, LOCK_DIR, f"{schemas.COMMIT_LOG}.lock"), lock_wait_s)
            if use_lock and store.is_local
            else None
        )
        self._log_dir = os.path.join(store.uri(schemas.COMMIT_LOG), "_delta_log") if store.is_local else None
        self._interval: int | None = None
        self._opened_at = -1  # version the handle was opened at (see RENEW_HANDLE_VERSIONS)
        self.conflicts = 0  # lost races, for benchmarks and tests

    def _catch_up(self) -> tuple[DeltaTable, HighWaterMarks]:
        if self._dt is None:
            self._dt = self._store.open_table(schemas.COMMIT_LOG)
            self._opened_at = int(self._dt.version())
        else:
            self._dt.update_incremental()
        self._hwm = read_hwm(self._dt)
        return self._dt, self._hwm

    def _behind(self) -> bool:
        """Whether a newer commit than our snapshot exists: a file probe on local stores, so a
        writer that is behind catches up before stamping instead of writing a doomed file."""
        if self._dt is None or self._hwm is None:
            return True
        if self._log_dir is None:
            return False  # an object store: find out by committing (a conflict catches up)
        return os.path.exists(os.path.join(self._log_dir, f"{int(self._dt.version()) + 1:020d}.json"))

    def append(
        self,
        messages: Sequence[PendingMessage] | PendingBatch,
        *,
        app_transactions: Mapping[str, int] | None = None,
        custom_metadata: Mapping[str, str] | None = None,
    ) -> list[Stamped]:
        """Commit a batch as exactly one new commit-log version; results in input order.

        As :meth:`append_batch`, with one :class:`Stamped` per message.
        """
        return self.append_batch(
            messages, app_transactions=app_transactions, custom_metadata=custom_metadata
        ).rows()

    def append_batch(
        self,
        messages: Sequence[PendingMessage] | PendingBatch,
        *,
        app_transactions: Mapping[str, int] | None = None,
        custom_metadata: Mapping[str, str] | None = None,
    ) -> StampedBatch:
        """Commit a batch as exactly one new commit-log version; results in columns, input order.

        Args:
            messages: what to append.
            app_transactions: Delta app transactions (app id -> version) committed atomically with
                the batch. A broker job re-putting messages passes its progress here; if the table
                already records a version >= the one given for any app id (another instance, or a
                replay, got there first), nothing is written and an empty batch is returned. Ids starting
                with :data:`EXPIRING_APP_PREFIX` expire after the table's transaction retention
                (7 days): the guarantee holds within it. Other ids never expire.
            custom_metadata: extra commitInfo entries.

        Raises:
            CommitConflictError: every attempt lost its race (retryable; nothing written).
            CommitStateUnknownError: the commit may have happened; nothing is acknowledged.
            StoreError: the write failed and nothing was committed.
        """
        batch = messages if isinstance(messages, PendingBatch) else PendingBatch.of(messages)
        if not batch.num_rows and not app_transactions:
            return _NOTHING
        with self._lock:
            host_lock = self._host_lock
            if host_lock is not None and not host_lock.acquire():
                if not host_lock.usable:
                    self._host_lock = None  # no lock file here: optimistic only from now on
                host_lock = None
            try:
                if self._behind():
                    self._catch_up()
                stamped = self._append_locked(batch, dict(app_transactions or {}), custom_metadata)
            finally:
                if host_lock is not None:
                    host_lock.release()
            if stamped.version >= 0:
                self._checkpoint_if_due(stamped.version)
                self._renew_if_aged()
            return stamped

    def _renew_if_aged(self) -> None:
        """Reopen the handle once it has moved on by :data:`RENEW_HANDLE_VERSIONS` versions.

        Done after the host lock is released, like the checkpoint. Best effort: the batch is already
        committed, so a failed reopen only leaves the writer without a handle, and the next append
        opens one (and reports the failure then, if it persists).
        """
        if self._dt is None or int(self._dt.version()) - self._opened_at < RENEW_HANDLE_VERSIONS:
            return
        self._dt = None
        try:
            self._catch_up()
        except (StoreError, DeltaError, OSError):
            self._dt = None

    def _checkpoint_if_due(self, version: int) -> None:
        """Write the checkpoint Delta's post-commit hook would have written at ``version``.

        Best effort: a checkpoint only speeds up loading the table; a missed one is taken at the
        next interval (or by the maintenance job).
        """
        dt = self._dt
        if (
            dt is None
            or version <= 0
            or version % self._checkpoint_interval(dt)
            or int(dt.version()) != version
        ):
            return
        try:
            dt.create_checkpoint()
            if dt.metadata().configuration.get("delta.enableExpiredLogCleanup", "true").lower() != "false":
                dt.cleanup_metadata()
        except (DeltaError, OSError):
            pass

    def _checkpoint_interval(self, dt: DeltaTable) -> int:
        if self._interval is None:
            raw = dt.metadata().configuration.get("delta.checkpointInterval")
            try:
                self._interval = max(1, int(raw)) if raw else DEFAULT_CHECKPOINT_INTERVAL
            except ValueError:
                self._interval = DEFAULT_CHECKPOINT_INTERVAL
        return self._interval

    def _append_locked(
        self, batch: PendingBatch, txns: dict[str, int], custom_metadata: Mapping[str, str] | None
    ) -> StampedBatch:
        assert self._dt is not None and self._hwm is not None
        store_id = self._store.store_id
        attempts = self._store.config.max_commit_attempts
        batch_id = uuid.uuid4().hex
        for attempt in range(attempts):
            dt, hwm = self._dt, self._hwm
            base_version = int(dt.version())
            if any(_recorded(dt, app) >= v for app, v in txns.items()):
                return _NOTHING
            now = now_ms()
            table, results, after = stamp(batch, hwm, store_id, now)
            try:
                write_deltalake(
                    dt,
                    table,
                    mode="append",
                    commit_properties=CommitProperties(
                        custom_metadata={
                            **(custom_metadata or {}),
                            HWM_KEY: after.to_json(),
                            BATCH_KEY: batch_id,
                        },
                        max_commit_retries=0,
                        app_transactions=_transactions(txns, now),
                    ),
                    writer_properties=_WRITER_PROPERTIES,
                    post_commithook_properties=_NO_HOOKS,
                )
            except CommitFailedError:
                self.conflicts += 1
                self._catch_up()
                # Jittered backoff keeps colliding writers from colliding again in lockstep.
                time.sleep(random.uniform(0, min(0.05, 0.001 * (2 ** min(attempt, 6)))))
                continue
            except (DeltaError, OSError) as exc:
                # Whatever happened, the handle and the marks may be behind the log now (a commit
                # that landed unseen moved it on): catch up before the next batch.
                self._dt = None
                committed = self._find_batch(batch_id, base_version)
                if committed is None:
                    raise StoreError(
                        f"commit-log write failed, nothing was stored: {exc}",
                        table="commit_log",
                        cause=exc,
                    ) from exc
                version = committed
            else:
                version = int(dt.version())
                if version != base_version + 1:  # pragma: no cover - delta-rs contract
                    self._dt = None
                    raise CommitStateUnknownError(
                        f"commit landed at version {version}, expected {base_version + 1}",
                        table="commit_log",
                    )
            self._hwm = after
            return dataclasses.replace(results, version=version)
        raise CommitConflictError(
            f"commit-log append lost {attempts} races in a row; retry later", table="commit_log"
        )

    def _find_batch(self, batch_id: str, base_version: int) -> int | None:
        """After an I/O error, tell whether our commit happened after all."""
        try:
            dt = self._store.open_table(schemas.COMMIT_LOG)
            latest = int(dt.version())
            if latest <= base_version:
                return None
            for info in dt.history(latest - base_version):
                if info.get(BATCH_KEY) == batch_id:
                    return int(info["version"])
            return None
        except Exception as exc:
            raise CommitStateUnknownError(
                f"commit-log write failed and its outcome cannot be read back: {exc}",
                table="commit_log",
                cause=exc,
            ) from exc
