"""Group membership and queue locks, kept in the ``groups`` table.

A member proves it is alive with HEARTBEAT rows (every 1-2 s) and says goodbye with a LEAVE row.
:func:`live_members` is every consumer whose latest event is a heartbeat younger than the timeout,
so a member that crashes drops out by itself; one that ran on the same host drops out at once
(:func:`known_dead`).

Orderly consumption locks queues with leases (RocketMQ: the broker keeps a lock 60 s, the client
relocks every 20 s and trusts its lock for 30 s). The lease decision is sequenced on the Delta log
(see :mod:`engine.store.groups`), so of two members racing for a queue exactly one wins. A member
trusts a lease for half its TTL after the moment it asked, so a member whose lease is about to
lapse stops before anyone else can take the queue, with half a TTL of slack for clock skew.
"""

from __future__ import annotations

import functools
import json
import os
import re
import socket
import threading
import time
import uuid
import zlib
from collections.abc import Iterable, Mapping
from typing import Any

from engine.errors import InvalidArgumentError
from engine.protocol import validate_group_name
from engine.protocol.rebalance import MessageModel, MessageQueue
from engine.store.groups import HEARTBEAT, LEAVE, MAX_LEASE_MS, MAX_MEMBER_MS, GroupLog
from engine.store.store import Store, now_ms

DEFAULT_MEMBER_TIMEOUT_MS = 6_000
DEFAULT_LOCK_TTL_MS = 60_000


def default_consumer_id() -> str:
    """A consumer id unique to this instance: host, pid and a random suffix, then (on Linux) the
    process's liveness tag, by which members on the same host learn at once that it died
    (:func:`known_dead`)."""
    tag = _liveness_tag(os.getpid())
    return f"{socket.gethostname()}@{os.getpid()}@{uuid.uuid4().hex[:8]}" + (f".{tag}" if tag else "")


# host@pid@random.<pid namespace tag><process start tag>, as default_consumer_id makes them
_TAGGED_ID = re.compile(r"^(?P<host>.+)@(?P<pid>\d+)@[0-9a-f]{8}\.(?P<ns>[0-9a-f]{8})(?P<start>[0-9a-f]{8})$")


def _crc(text: str) -> str:
    return f"{zlib.crc32(text.encode()):08x}"


@functools.cache
def _namespace_tag() -> str | None:
    """This host's boot and this process's pid namespace: pids compare only within them."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            boot = f.read().strip()
        return _crc(f"{boot}:{os.stat('/proc/self/ns/pid').st_ino}")
    except OSError:
        return None


def _start_tag(pid: int) -> str | None:
    """Process ``pid``'s start (in clock ticks since boot): a pid reused later starts later. None
    when there is no such process, or it has ended and waits for its parent (a zombie), or no /proc."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    # fields 3 (state) and 22 (start time) of stat, counted after the command name
    if len(fields) < 20 or fields[0] in ("Z", "X"):
        return None
    return _crc(f"{pid}:{fields[19]}")


def _liveness_tag(pid: int) -> str | None:
    ns, start = _namespace_tag(), _start_tag(pid)
    return None if ns is None or start is None else ns + start


def known_dead(consumer_id: str) -> bool:
    """Whether ``consumer_id`` names a process of this host and pid namespace that has ended.

    A member's heartbeats stop when it dies, but the others would wait ``member_timeout_ms`` to
    notice; a RocketMQ broker learns it at once from the closed connection and tells the group. For
    a member with a default id (:func:`default_consumer_id`) on the same host the answer is at hand:
    its process is gone, or its pid now belongs to a process started later. Any other id (given by
    the user, another host, another container) is never known dead: its heartbeats decide.
    """
    match = _TAGGED_ID.match(consumer_id)
    if match is None or match["host"] != socket.gethostname() or match["ns"] != _namespace_tag():
        return False
    return _start_tag(int(match["pid"])) != match["start"]


DEFAULT_INSTANCE_NAME = "DEFAULT"


def host_client_id(instance_name: str = DEFAULT_INSTANCE_NAME) -> str:
    """RocketMQ's client id ``ip@instanceName``: the same for every process of this host.

    A broadcasting consumer keeps its offsets under this id, so one restarted on the same host
    resumes where it stopped (RocketMQ renames only clustering instances to ``pid#time``).
    """
    try:
        ip = socket.gethostbyname(socket.gethostname())
    except OSError:
        ip = socket.gethostname()
    return f"{ip}@{instance_name}"


def _positive_ms(name: str, value: object, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InvalidArgumentError(f"{name} {value!r} must be an int > 0 (milliseconds)", **{name: value})
    if maximum is not None and value > maximum:
        raise InvalidArgumentError(f"{name} {value!r} must be at most {maximum} ms", **{name: value})
    return value


def _latest_alive(rows: Iterable[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """Per consumer, its latest HEARTBEAT when that is its latest membership event (and it is not
    known dead)."""
    latest: dict[str, Mapping[str, Any]] = {}
    for row in rows:
        if row["event"] not in (HEARTBEAT, LEAVE):
            continue
        cid = row["consumer_id"]
        seen = latest.get(cid)
        # On equal timestamps LEAVE wins: a member never heartbeats after leaving.
        if seen is None or (row["ts_ms"], row["event"] == LEAVE) > (seen["ts_ms"], seen["event"] == LEAVE):
            latest[cid] = row
    return {cid: row for cid, row in latest.items() if row["event"] == HEARTBEAT and not known_dead(cid)}


def live_members(
    store: Store, group: str, timeout_ms: int = DEFAULT_MEMBER_TIMEOUT_MS, *, log: GroupLog | None = None
) -> list[str]:
    """Sorted ids of the group's consumers that heartbeated within ``timeout_ms`` and did not leave.

    Raises:
        InvalidArgumentError: a bad group or timeout.
    """
    validate_group_name(group)
    _positive_ms("timeout_ms", timeout_ms, MAX_MEMBER_MS)
    since = now_ms() - timeout_ms
    members = (log or GroupLog(store)).members(group)
    return sorted(cid for cid, m in members.items() if m.last_heartbeat_ms >= since and not known_dead(cid))


def live_subscriptions(
    store: Store, timeout_ms: int = DEFAULT_MEMBER_TIMEOUT_MS
) -> dict[str, dict[str, dict[str, str]]]:
    """Every group's live members and the subscriptions of their latest heartbeat: group ->
    consumer id -> topic -> expression. Scans the rows of the last ``timeout_ms`` (a tool's read).

    Raises:
        InvalidArgumentError: a bad timeout.
    """
    _positive_ms("timeout_ms", timeout_ms, MAX_MEMBER_MS)
    since = now_ms() - timeout_ms
    rows = GroupLog(store).recent_all(since)
    by_group: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_group.setdefault(row["group"], []).append(row)
    return {
        group: {
            cid: json.loads(row["subscriptions"]) if row["subscriptions"] else {}
            for cid, row in sorted(_latest_alive(group_rows).items())
        }
        for group, group_rows in sorted(by_group.items())
    }


class GroupMembership:
    """One consumer's membership of a group: heartbeats, leave, live members and queue locks.

    Args:
        store: an open store.
        group: the consumer group.
        consumer_id: this member's id (unique in the group).
        model: the group's message model, recorded with each heartbeat.
        member_timeout_ms: a member silent this long is no longer live.
        lock_ttl_ms: lease length of a queue lock (at most 10 minutes); the holder trusts it for
            half of that and should relock more often than that.

    Raises:
        InvalidArgumentError: a bad group, id or interval.
    """

    def __init__(
        self,
        store: Store,
        group: str,
        consumer_id: str,
        *,
        model: MessageModel = MessageModel.CLUSTERING,
        member_timeout_ms: int = DEFAULT_MEMBER_TIMEOUT_MS,
        lock_ttl_ms: int = DEFAULT_LOCK_TTL_MS,
    ) -> None:
        self.group = validate_group_name(group)
        if not isinstance(consumer_id, str) or not consumer_id or any(c.isspace() for c in consumer_id):
            raise InvalidArgumentError(
                "consumer_id must be a non-empty string without whitespace", consumer_id=consumer_id
            )
        self.consumer_id = consumer_id
        self.model = MessageModel(model)
        self.member_timeout_ms = _positive_ms("member_timeout_ms", member_timeout_ms, MAX_MEMBER_MS)
        self.lock_ttl_ms = _positive_ms("lock_ttl_ms", lock_ttl_ms, MAX_LEASE_MS)
        self._store = store
        self._log = GroupLog(store)
        self._lock = threading.Lock()
        self._last_ts = 0
        self._valid_until: dict[MessageQueue, float] = {}  # monotonic deadline of each held lock

    def _ts(self) -> int:
        with self._lock:
            self._last_ts = max(now_ms(), self._last_ts + 1)
            return self._last_ts

    def _row(self, event: str, ts: int, subscriptions: Mapping[str, str] | None) -> dict[str, Any]:
        return {
            "group": self.group,
            "consumer_id": self.consumer_id,
            "event": event,
            "model": str(self.model),
            "subscriptions": json.dumps(dict(subscriptions), sort_keys=True) if subscriptions else None,
            "topic": None,
            "queue_id": None,
            "ts_ms": ts,
            "expire_ms": ts + self.member_timeout_ms if event == HEARTBEAT else None,
        }

    # ----------------------------------------------------------------- membership
    def heartbeat(self, subscriptions: Mapping[str, str] | None = None) -> None:
        """Record that this member is alive, with its subscriptions (topic -> expression)."""
        self._log.write([self._row(HEARTBEAT, self._ts(), subscriptions)])

    def leave(self) -> None:
        """Record that this member left; it is no longer live from now on."""
        self._log.write([self._row(LEAVE, self._ts(), None)])

    def live_members(self) -> list[str]:
        """Sorted ids of the group's live members (reads one commit, however long the history)."""
        return live_members(self._store, self.group, self.member_timeout_ms, log=self._log)

    def subscriptions(self) -> dict[str, dict[str, str]]:
        """Live members and the subscriptions of their latest heartbeat (scans recent rows)."""
        rows = self._log.recent(self.group, now_ms() - self.member_timeout_ms)
        return {
            cid: json.loads(row["subscriptions"]) if row["subscriptions"] else {}
            for cid, row in sorted(_latest_alive(rows).items())
        }

    # ----------------------------------------------------------------- locks
    def lock(self, queues: Iterable[MessageQueue]) -> set[MessageQueue]:
        """Acquire or renew the locks of ``queues`` in one commit; returns the ones now held.

        A queue is granted when nobody holds an unexpired lease on it or this member does.
        """
        wanted = sorted(set(queues))
        if not wanted:
            return set()
        asked = time.monotonic()
        granted = self._log.write(
            group=self.group,
            owner=self.consumer_id,
            model=str(self.model),
            lock=[(q.topic, q.queue_id) for q in wanted],
            ttl_ms=self.lock_ttl_ms,
        )
        held = {MessageQueue(t, q) for t, q in granted}
        with self._lock:
            for mq in wanted:
                if mq in held:
                    self._valid_until[mq] = asked + self.lock_ttl_ms / 2000
                else:
                    self._valid_until.pop(mq, None)
        return held

    def unlock(self, queues: Iterable[MessageQueue]) -> None:
        """Release the locks this member holds on ``queues`` (one commit)."""
        wanted = sorted(set(queues))
        if not wanted:
            return
        with self._lock:
            for mq in wanted:
                self._valid_until.pop(mq, None)
        self._log.write(
            group=self.group,
            owner=self.consumer_id,
            model=str(self.model),
            unlock=[(q.topic, q.queue_id) for q in wanted],
            ttl_ms=self.lock_ttl_ms,
        )

    def is_locked(self, queue: MessageQueue) -> bool:
        """True while this member may trust its lock on ``queue`` (no I/O)."""
        with self._lock:
            return self._valid_until.get(queue, 0.0) > time.monotonic()

    def held_locks(self) -> set[MessageQueue]:
        """Queues whose lock this member may trust now (no I/O)."""
        now = time.monotonic()
        with self._lock:
            return {mq for mq, until in self._valid_until.items() if until > now}

    def lock_owners(self) -> dict[MessageQueue, str]:
        """Every unexpired lock of the group and its holder, as the table says now."""
        return {MessageQueue(t, q): lease.owner for (t, q), lease in self._log.leases(self.group).items()}
