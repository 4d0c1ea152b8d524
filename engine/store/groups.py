"""The ``groups`` table: consumer-group heartbeats and queue leases (orderly-consumption locks).

The table is an append-only history (HEARTBEAT, LEAVE, LOCK, UNLOCK rows) that SQL can read. The
current state, who is a member and who holds which queue, is sequenced on the Delta log itself, like
the commit log's offsets: every commit this module makes carries, in its commitInfo
(:data:`~engine.store.commit_markers.GROUPS_STATE_KEY`), the state after it. A writer reads the
state of the version it holds, applies its rows and decisions (a queue is free when nobody holds it,
its lease expired, or the writer holds it already), and commits exactly the next version with
automatic retries disabled. If another writer took that version, it catches up and decides again. So
two members racing for one queue are ordered by the Delta log and exactly one gets it: the Delta log
is the lock.

Readers need only the newest commit that carries the state, not the whole history, so looking up
members and locks costs the same after a year of heartbeats as after a minute. A LOCK row is only
written for a granted lease, so in the rows, too, the newest unexpired LOCK of a queue (unless
UNLOCKed later) names its holder.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds

from engine.errors import CommitConflictError, StoreError
from engine.store import schemas
from engine.store.commit_markers import GROUPS_STATE_KEY as STATE_KEY
from engine.store.delta import Snapshot, backoff, commit_next
from engine.store.store import Store, now_ms, sql_literal

HEARTBEAT = "HEARTBEAT"
LEAVE = "LEAVE"
LOCK = "LOCK"
UNLOCK = "UNLOCK"
# Longest lease a writer may take, and longest member timeout a reader may use: members silent for
# longer are forgotten. A reader looking for the newest state stops at a commit older than this
# (plus clock slack): nothing recorded before it still counts.
MAX_LEASE_MS = 10 * 60_000
MAX_MEMBER_MS = 10 * 60_000
_CLOCK_SLACK_MS = 60_000

QueueKey = tuple[str, int]


@dataclass(frozen=True)
class Lease:
    """A queue lease: ``owner`` holds the queue until ``expire_ms`` (epoch ms) unless it unlocks."""

    owner: str
    expire_ms: int


@dataclass(frozen=True)
class Member:
    """A member's latest heartbeat (epoch ms) and message model."""

    last_heartbeat_ms: int
    model: str


def _key(queue: QueueKey) -> str:
    return f"{queue[0]}:{queue[1]}"  # topic names never contain ':'


def _unkey(key: str) -> QueueKey:
    topic, _, qid = key.rpartition(":")
    return topic, int(qid)


def _keep(
    table: dict[str, dict[str, list[Any]]], alive: Callable[[list[Any]], bool]
) -> dict[str, dict[str, list[Any]]]:
    kept = {g: {k: v for k, v in entries.items() if alive(v)} for g, entries in table.items()}
    return {g: entries for g, entries in kept.items() if entries}


@dataclass
class _State:
    """Members and leases of every group (JSON-friendly: group -> id -> [values])."""

    leases: dict[str, dict[str, list[Any]]] = field(default_factory=dict)
    members: dict[str, dict[str, list[Any]]] = field(default_factory=dict)

    def copy(self) -> _State:
        return _State(
            {g: {k: list(v) for k, v in q.items()} for g, q in self.leases.items()},
            {g: {k: list(v) for k, v in m.items()} for g, m in self.members.items()},
        )

    def to_json(self) -> str:
        return json.dumps({"l": self.leases, "m": self.members}, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> _State:
        data = json.loads(text)
        return cls(dict(data.get("l", {})), dict(data.get("m", {})))

    def prune(self, now: int) -> None:
        """Forget expired leases and members silent for longer than any reader may wait."""
        self.leases = _keep(self.leases, lambda v: int(v[1]) > now)
        self.members = _keep(self.members, lambda v: int(v[0]) > now - MAX_MEMBER_MS)

    def apply_rows(self, rows: Sequence[Mapping[str, Any]]) -> None:
        for row in rows:
            group, cid = str(row["group"]), str(row["consumer_id"])
            if row["event"] == HEARTBEAT:
                members = self.members.setdefault(group, {})
                seen = members.get(cid)
                if seen is None or int(row["ts_ms"]) >= int(seen[0]):
                    members[cid] = [int(row["ts_ms"]), str(row["model"])]
            elif row["event"] == LEAVE:
                members = self.members.get(group, {})
                seen = members.get(cid)
                if seen is not None and int(row["ts_ms"]) >= int(seen[0]):
                    del members[cid]
                    if not members:
                        self.members.pop(group, None)


class GroupLog:
    """Reads and writes the ``groups`` table of a store. Thread-safe; one per consumer is fine."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._dt: Snapshot | None = None
        self._state = _State()
        self._state_version = -1  # version whose state is cached in _state
        self.conflicts = 0  # lost races, for tests

    # ----------------------------------------------------------------- reading
    def recent(self, group: str, since_ms: int) -> list[dict[str, Any]]:
        """Rows of one group with ``ts_ms >= since_ms``: a scan for tools, not for hot paths."""
        table = self._store.read(
            schemas.GROUPS,
            predicate=f"group = {sql_literal(group)} AND ts_ms >= {int(since_ms)}",
            filter=(ds.field("group") == group) & (ds.field("ts_ms") >= since_ms),
        )
        rows: list[dict[str, Any]] = table.to_pylist()
        return rows

    def recent_all(self, since_ms: int) -> list[dict[str, Any]]:
        """Rows of every group with ``ts_ms >= since_ms``: a scan for tools, not for hot paths."""
        table = self._store.read(
            schemas.GROUPS,
            predicate=f"ts_ms >= {int(since_ms)}",
            filter=ds.field("ts_ms") >= since_ms,
        )
        rows: list[dict[str, Any]] = table.to_pylist()
        return rows

    def leases(self, group: str) -> dict[QueueKey, Lease]:
        """Unexpired leases of one group, as of the latest version."""
        state = self._latest()
        now = now_ms()
        return {
            _unkey(k): Lease(str(owner), int(expire))
            for k, (owner, expire) in state.leases.get(group, {}).items()
            if int(expire) > now
        }

    def members(self, group: str) -> dict[str, Member]:
        """Members of one group that did not leave, with their latest heartbeat, as of now."""
        state = self._latest()
        return {cid: Member(int(ts), str(model)) for cid, (ts, model) in state.members.get(group, {}).items()}

    def _latest(self) -> _State:
        with self._lock:
            return self._state_at(self._catch_up())

    def _catch_up(self) -> Snapshot:
        self._dt = self._store.caught_up(schemas.GROUPS, self._dt)
        return self._dt

    def _state_at(self, dt: Snapshot) -> _State:
        """The state as of ``dt``'s version: from the newest commit carrying one, at or before it.

        Commit files are read by exact version (delta-rs ``history`` on a stale snapshot lists newer
        commits under older version numbers).
        """
        version = dt.version()
        if version == self._state_version:
            return self._state.copy()
        found: _State | None = None
        oldest_useful = now_ms() - max(MAX_LEASE_MS, MAX_MEMBER_MS) - _CLOCK_SLACK_MS
        v = version
        while v > self._state_version and v >= 0:
            try:
                info = dt.commit_info(v)
            except StoreError:
                found = _State()  # the log was cleaned up: anything older no longer counts
                break
            if STATE_KEY in info:
                found = _State.from_json(str(info[STATE_KEY]))
                break
            if int(info.get("timestamp", 0) or 0) < oldest_useful:
                found = _State()
                break
            v -= 1
        if found is None:
            found = self._state if v == self._state_version and v >= 0 else _State()
        self._state, self._state_version = found, version
        return found.copy()

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
        """Append ``rows`` (HEARTBEAT / LEAVE) and change ``owner``'s leases in ``group``, as one commit.

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
                base = dt.version()
                state = self._state_at(dt)
                now = now_ms()
                state.prune(now)
                state.apply_rows(rows)
                held = state.leases.setdefault(group, {}) if group is not None else {}
                granted: list[QueueKey] = []
                released: list[QueueKey] = []
                for queue in lock:
                    current = held.get(_key(queue))
                    if current is None or current[0] == owner:
                        held[_key(queue)] = [owner, now + ttl_ms]
                        granted.append(queue)
                for queue in unlock:
                    current = held.get(_key(queue))
                    if current is not None and current[0] == owner:
                        del held[_key(queue)]
                        released.append(queue)
                if group is not None and not held:
                    state.leases.pop(group, None)
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
                    commit_next(
                        dt,
                        rows=pa.Table.from_pylist(out, schema=schemas.GROUPS_SCHEMA),
                        custom_metadata={STATE_KEY: state.to_json()},
                    )
                except CommitConflictError:
                    self.conflicts += 1
                    backoff(attempt)
                    continue
                except StoreError:
                    self._dt, self._state_version = None, -1
                    raise
                self._state, self._state_version = state, base + 1
                if dt.aged:  # reopen (the state stays: current)
                    self._dt = None
                return set(granted)
            raise CommitConflictError(
                f"groups write lost {attempts} races in a row; retry later", table=schemas.GROUPS
            )
