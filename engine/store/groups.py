"""The ``groups`` table: consumer-group heartbeats and queue leases (orderly-consumption locks).

Leases are sequenced on the Delta log itself, like the commit log's offsets. Every commit this
module makes carries, in its commitInfo (``mq.leases``), the lease table after it: for every group,
which consumer holds which queue until when. A writer reads the leases of the version it holds,
decides (a queue is free when nobody holds it, its lease expired, or the writer itself holds it),
and commits exactly the next version with automatic retries disabled. If another writer took that
version, it catches up and decides again. So two members racing for one queue are ordered by the
Delta log and exactly one gets it: the Delta log is the lock.

The LOCK / UNLOCK rows written with each decision make the same history readable with SQL: a LOCK
row is only written for a granted lease, so the newest unexpired LOCK of a queue, unless UNLOCKed
later, names its holder.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
from deltalake import CommitProperties, DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError

from engine.errors import CommitConflictError, StoreError
from engine.store import schemas
from engine.store.log import read_version
from engine.store.store import Store, now_ms, sql_literal

HEARTBEAT = "HEARTBEAT"
LEAVE = "LEAVE"
LOCK = "LOCK"
UNLOCK = "UNLOCK"
LEASES_KEY = "mq.leases"
# Longest lease a writer may take. A reader looking for the newest lease table stops at a commit
# older than this (plus clock slack): every lease recorded before it has expired.
MAX_LEASE_MS = 10 * 60_000
_CLOCK_SLACK_MS = 60_000

QueueKey = tuple[str, int]
# group -> "topic:queue_id" -> [owner, expire_ms]; JSON-friendly.
_Leases = dict[str, dict[str, list[Any]]]


@dataclass(frozen=True)
class Lease:
    """A queue lease: ``owner`` holds the queue until ``expire_ms`` (epoch ms) unless it unlocks."""

    owner: str
    expire_ms: int


def _key(queue: QueueKey) -> str:
    return f"{queue[0]}:{queue[1]}"  # topic names never contain ':'


def _unkey(key: str) -> QueueKey:
    topic, _, qid = key.rpartition(":")
    return topic, int(qid)


def _copy(leases: _Leases) -> _Leases:
    return {group: {k: list(v) for k, v in queues.items()} for group, queues in leases.items()}


def _prune(leases: _Leases, now: int) -> None:
    for group in list(leases):
        queues = leases[group]
        for key in [k for k, (_, expire) in queues.items() if int(expire) <= now]:
            del queues[key]
        if not queues:
            del leases[group]


class GroupLog:
    """Reads and writes the ``groups`` table of a store. Thread-safe; one per consumer is fine."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._uri = store.uri(schemas.GROUPS)
        self._lock = threading.Lock()
        self._dt: DeltaTable | None = None
        self._leases: _Leases = {}
        self._leases_version = -1  # version whose lease table is cached in _leases
        self.conflicts = 0  # lost races, for tests

    # ----------------------------------------------------------------- reading
    def recent(self, group: str, since_ms: int) -> list[dict[str, Any]]:
        """Rows of one group with ``ts_ms >= since_ms`` (files pruned by their statistics)."""
        table = self._store.read(
            schemas.GROUPS,
            predicate=f"group = {sql_literal(group)} AND ts_ms >= {int(since_ms)}",
            filter=(ds.field("group") == group) & (ds.field("ts_ms") >= since_ms),
        )
        rows: list[dict[str, Any]] = table.to_pylist()
        return rows

    def leases(self, group: str) -> dict[QueueKey, Lease]:
        """Unexpired leases of one group, as of the latest version."""
        with self._lock:
            dt = self._catch_up()
            leases = self._leases_at(dt)
        now = now_ms()
        return {
            _unkey(k): Lease(str(owner), int(expire))
            for k, (owner, expire) in leases.get(group, {}).items()
            if int(expire) > now
        }

    def _catch_up(self) -> DeltaTable:
        if self._dt is None:
            self._dt = self._store.open_table(schemas.GROUPS)
        else:
            self._dt.update_incremental()
        return self._dt

    def _leases_at(self, dt: DeltaTable) -> _Leases:
        """The lease table as of ``dt``'s version: the newest commit carrying one, at or before it."""
        version = int(dt.version())
        if version == self._leases_version:
            return _copy(self._leases)
        found: _Leases | None = None
        oldest_useful = now_ms() - MAX_LEASE_MS - _CLOCK_SLACK_MS
        v = version
        while v > self._leases_version and v >= 0:
            try:
                info = read_version(self._uri, v, self._store.storage_options).commit_info
            except StoreError:
                found = {}  # the log was cleaned up: anything older is long expired
                break
            if LEASES_KEY in info:
                found = json.loads(str(info[LEASES_KEY]))
                break
            if int(info.get("timestamp", 0) or 0) < oldest_useful:
                found = {}
                break
            v -= 1
        if found is None:
            found = self._leases if v == self._leases_version and v >= 0 else {}
        self._leases, self._leases_version = found, version
        return _copy(found)

    # ----------------------------------------------------------------- writing
    def write(
        self,
        rows: Sequence[Mapping[str, Any]] = (),
        *,
        group: str | None = None,
        owner: str | None = None,
        model: str = "CLUSTERING",
        lock: Iterable[QueueKey] = (),
        unlock: Iterable[QueueKey] = (),
        ttl_ms: int = 60_000,
    ) -> set[QueueKey]:
        """Append ``rows`` and change ``owner``'s leases in ``group``, as one commit.

        A queue in ``lock`` is granted (or renewed) when it has no unexpired lease or ``owner``
        holds it; ``unlock`` releases queues ``owner`` holds. A LOCK row is written per granted
        queue and an UNLOCK row per released one; nothing is committed when there is nothing to
        write. Returns the queues granted.

        Raises:
            CommitConflictError: lost every race (nothing written; retryable).
            StoreError: the write failed; whether it happened is unknown, so callers must not
                rely on a lease from it (it expires by itself).
        """
        lock, unlock = list(lock), list(unlock)
        if (lock or unlock) and (group is None or owner is None):
            raise ValueError("group and owner are needed to change leases")
        if not 0 < ttl_ms <= MAX_LEASE_MS:
            raise ValueError(f"ttl_ms must be 1..{MAX_LEASE_MS}")
        attempts = self._store.config.max_commit_attempts
        with self._lock:
            for attempt in range(attempts):
                dt = self._catch_up()
                base = int(dt.version())
                leases = self._leases_at(dt)
                now = now_ms()
                _prune(leases, now)
                mine = leases.setdefault(group, {}) if group is not None else {}
                granted: list[QueueKey] = []
                released: list[QueueKey] = []
                for queue in lock:
                    current = mine.get(_key(queue))
                    if current is None or current[0] == owner:
                        mine[_key(queue)] = [owner, now + ttl_ms]
                        granted.append(queue)
                for queue in unlock:
                    current = mine.get(_key(queue))
                    if current is not None and current[0] == owner:
                        del mine[_key(queue)]
                        released.append(queue)
                if group is not None and not mine:
                    leases.pop(group, None)
                out = [dict(r) for r in rows]
                for event, queues, expire in ((LOCK, granted, now + ttl_ms), (UNLOCK, released, None)):
                    out.extend(
                        {
                            "group": group,
                            "consumer_id": owner,
                            "event": event,
                            "model": model,
                            "subscriptions": None,
                            "topic": topic,
                            "queue_id": qid,
                            "ts_ms": now,
                            "expire_ms": expire,
                        }
                        for topic, qid in queues
                    )
                if not out:
                    return set()
                try:
                    write_deltalake(
                        dt,
                        pa.Table.from_pylist(out, schema=schemas.GROUPS_SCHEMA),
                        mode="append",
                        commit_properties=CommitProperties(
                            custom_metadata={LEASES_KEY: json.dumps(leases, separators=(",", ":"))},
                            max_commit_retries=0,
                        ),
                    )
                except CommitFailedError:
                    self.conflicts += 1
                    time.sleep(random.uniform(0, min(0.05, 0.001 * (2 ** min(attempt, 6)))))
                    continue
                except (DeltaError, OSError) as exc:
                    self._dt, self._leases_version = None, -1
                    raise StoreError(
                        f"write to groups failed: {exc}", table=schemas.GROUPS, cause=exc
                    ) from exc
                self._leases, self._leases_version = leases, base + 1
                return set(granted)
            raise CommitConflictError(
                f"groups write lost {attempts} races in a row; retry later", table=schemas.GROUPS
            )
