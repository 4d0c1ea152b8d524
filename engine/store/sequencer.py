"""Optimistic sequencing of the commit log on the Delta log itself.

Every commit to ``commit_log`` carries, in its commitInfo (``mq.hwm``), the high-water marks after
it: the next physical offset, the last store time and the next queue offset of every queue. A writer
stamps its batch from the marks of the version it read, then commits exactly the next version with
automatic retries disabled. If another writer took that version, it catches up from the newer
commit's marks and stamps again. The Delta log is the lock: no offset is assigned twice and queue
offsets stay dense, however many processes append.
"""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError

from engine.errors import CommitConflictError, CommitStateUnknownError, StoreError
from engine.model import UNDISPATCHED_FLAGS
from engine.protocol import make_msg_id, record_size, tags_code
from engine.store import schemas
from engine.store.store import Store, now_ms

HWM_KEY = "mq.hwm"
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


@dataclass(frozen=True)
class PendingMessage:
    """A validated message waiting for its offsets."""

    topic: str
    queue_id: int
    body: bytes
    uniq_key: str
    tags: str | None = None
    keys: tuple[str, ...] = ()
    properties: dict[str, str] = field(default_factory=dict)
    born_ts_ms: int = 0
    sys_flag: int = 0
    delay_level: int = 0
    deliver_at_ms: int | None = None
    reconsume_times: int = 0
    tags_code: int | None = None  # override (schedule topic keeps the due time here)


@dataclass(frozen=True)
class Stamped:
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
    version = int(dt.version())
    depth = 8
    while True:
        history = dt.history(depth)
        for info in history:
            if int(info.get("version", -1)) > version:
                continue
            if HWM_KEY in info:
                return HighWaterMarks.from_json(str(info[HWM_KEY]))
        if len(history) < depth:
            break
        depth *= 4
        if depth > 4096:
            break
    return recover_hwm_by_scan(dt)


def recover_hwm_by_scan(dt: DeltaTable) -> HighWaterMarks:
    """Rebuild the marks from the rows themselves (slow; only when the log lost them)."""
    table = dt.to_pyarrow_table(
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


def stamp(
    messages: Sequence[PendingMessage], hwm: HighWaterMarks, store_id: str, ts_ms: int
) -> tuple[pa.Table, list[Stamped], HighWaterMarks]:
    """Give each message its offsets, in order; returns the rows, the results and the new marks.

    Pure: the caller commits the rows and keeps the marks only if the commit wins.
    """
    after = hwm.copy()
    store_ts = max(ts_ms, hwm.store_ts_ms)
    after.store_ts_ms = store_ts
    cols: dict[str, list[Any]] = {name: [] for name in schemas.COMMIT_LOG_SCHEMA.names}
    results: list[Stamped] = []
    for m in messages:
        size = record_size(m.topic, len(m.body), m.properties)
        physical = after.physical
        after.physical += size
        if m.sys_flag in UNDISPATCHED_FLAGS:
            queue_offset = -1
        else:
            offsets = after.queues.setdefault(m.topic, [])
            while len(offsets) <= m.queue_id:
                offsets.append(0)
            queue_offset = offsets[m.queue_id]
            offsets[m.queue_id] = queue_offset + 1
        msg_id = make_msg_id(store_id, physical)
        cols["physical_offset"].append(physical)
        cols["topic"].append(m.topic)
        cols["queue_id"].append(m.queue_id)
        cols["queue_offset"].append(queue_offset)
        cols["msg_id"].append(msg_id)
        cols["uniq_key"].append(m.uniq_key)
        cols["tags"].append(m.tags)
        cols["tags_code"].append(m.tags_code if m.tags_code is not None else tags_code(m.tags))
        cols["keys"].append(list(m.keys))
        cols["properties"].append(list(m.properties.items()))
        cols["body"].append(m.body)
        cols["size"].append(size)
        cols["born_ts_ms"].append(m.born_ts_ms or store_ts)
        cols["store_ts_ms"].append(store_ts)
        cols["sys_flag"].append(m.sys_flag)
        cols["delay_level"].append(m.delay_level)
        cols["deliver_at_ms"].append(m.deliver_at_ms)
        cols["reconsume_times"].append(m.reconsume_times)
        results.append(Stamped(msg_id, m.uniq_key, m.topic, m.queue_id, queue_offset, physical, store_ts, -1))
    table = pa.Table.from_pydict(cols, schema=schemas.COMMIT_LOG_SCHEMA)
    return table, results, after


def _recorded(dt: DeltaTable, app_id: str) -> int:
    version = dt.transaction_version(app_id)
    return -1 if version is None else int(version)


class CommitLogWriter:
    """Appends batches to ``commit_log`` with sequenced offsets; one per process is enough.

    Thread-safe: batches from several threads are committed one after another.
    """

    def __init__(self, store: Store) -> None:
        self._store = store
        self._dt: DeltaTable | None = None
        self._hwm: HighWaterMarks | None = None
        self._lock = threading.Lock()
        self.conflicts = 0  # lost races, for benchmarks and tests

    def _catch_up(self) -> tuple[DeltaTable, HighWaterMarks]:
        if self._dt is None:
            self._dt = self._store.open_table(schemas.COMMIT_LOG)
        else:
            self._dt.update_incremental()
        self._hwm = read_hwm(self._dt)
        return self._dt, self._hwm

    def append(
        self,
        messages: Sequence[PendingMessage],
        *,
        app_transactions: Mapping[str, int] | None = None,
        custom_metadata: Mapping[str, str] | None = None,
    ) -> list[Stamped]:
        """Commit a batch as exactly one new commit-log version; results in input order.

        Args:
            messages: what to append.
            app_transactions: Delta app transactions (app id -> version) committed atomically with
                the batch. A broker job re-putting messages passes its progress here; if the table
                already records a version >= the one given for any app id (another instance, or a
                replay, got there first), nothing is written and ``[]`` is returned.
            custom_metadata: extra commitInfo entries.

        Raises:
            CommitConflictError: every attempt lost its race (retryable; nothing written).
            CommitStateUnknownError: the commit may have happened; nothing is acknowledged.
            StoreError: the write failed and nothing was committed.
        """
        if not messages and not app_transactions:
            return []
        txns = dict(app_transactions or {})
        store_id = self._store.store_id
        attempts = self._store.config.max_commit_attempts
        batch_id = uuid.uuid4().hex
        with self._lock:
            if self._dt is None or self._hwm is None:
                self._catch_up()
            assert self._dt is not None and self._hwm is not None
            for attempt in range(attempts):
                dt, hwm = self._dt, self._hwm
                base_version = int(dt.version())
                if any(_recorded(dt, app) >= v for app, v in txns.items()):
                    return []
                table, results, after = stamp(messages, hwm, store_id, now_ms())
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
                            app_transactions=[Transaction(app, v) for app, v in txns.items()] or None,
                        ),
                    )
                except CommitFailedError:
                    self.conflicts += 1
                    self._catch_up()
                    # Jittered backoff keeps colliding writers from colliding again in lockstep.
                    time.sleep(random.uniform(0, min(0.05, 0.001 * (2 ** min(attempt, 6)))))
                    continue
                except (DeltaError, OSError) as exc:
                    committed = self._find_batch(batch_id, base_version)
                    if committed is None:
                        self._dt = None
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
                return [
                    Stamped(
                        r.msg_id,
                        r.uniq_key,
                        r.topic,
                        r.queue_id,
                        r.queue_offset,
                        r.physical_offset,
                        r.store_ts_ms,
                        version,
                    )
                    for r in results
                ]
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
