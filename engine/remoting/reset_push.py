"""Offset resets pushed to running wire consumers (RocketMQ's ``Broker2Client.resetOffset``).

A reset is made in the store by the engine's admin code (``mq group reset``, ``Admin``, or the
broker's own INVOKE_BROKER_TO_RESET_OFFSET handler, which calls the same code) and recorded in the
``offset_resets`` table. The server watches that table for every group with a connected wire
consumer (:class:`~engine.client.resets.ResetWatcher`) and pushes each new reset to the group's
connections as RESET_CONSUMER_CLIENT_OFFSET, one-way, as RocketMQ's broker does.

A Java consumer that gets the push drops its queues, sleeps 10 s, then reports the reset offset
itself; in that window its periodic offset report still carries the old offsets. So each reset
queue is *guarded*: reports that differ from the reset offset are ignored until the client shows it
followed the reset (it reports the reset offset, or pulls the queue from exactly there) or
:data:`GUARD_MS` passed (a client that never follows the push), and the reset offset is reported
again at once, so the table holds it whatever was pending. The pull counts because a client that
followed may never report the reset offset itself: one that consumes again before its next periodic
report (every 5 s) reports past it, and a pull from offset 0 piggybacks no offset at all.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass

from engine.client.resets import ResetWatcher
from engine.remoting.codes import RPC_ONEWAY, RequestCode
from engine.remoting.frames import RemotingCommand
from engine.store.store import Store, now_ms

_log = logging.getLogger(__name__)

GUARD_MS = 30_000  # the Java client reports the reset offset 10 s after the push
QueueKey = tuple[str, str, int]  # group, topic, queue id


@dataclass(frozen=True)
class GroupReset:
    """New offsets of one group's queues of one topic, as pushed to its clients."""

    group: str
    topic: str
    offsets: dict[int, int]
    timestamp_ms: int = -1


def reset_offset_body(broker_name: str, topic: str, offsets: dict[int, int]) -> bytes:
    """``ResetOffsetBody`` as fastjson writes it: a map whose keys are MessageQueue objects.

    This is not strict JSON (object keys), but it is what RocketMQ's broker sends and its
    clients' fastjson reads back.
    """
    entries = ",".join(
        "{"
        + f'"brokerName":{json.dumps(broker_name)},"queueId":{queue_id},"topic":{json.dumps(topic)}'
        + f"}}:{offset}"
        for queue_id, offset in sorted(offsets.items())
    )
    return ('{"offsetTable":{' + entries + "}}").encode()


def reset_request(broker_name: str, reset: GroupReset) -> RemotingCommand:
    """The one-way RESET_CONSUMER_CLIENT_OFFSET request a client of the group receives."""
    fields = {
        "topic": reset.topic,
        "group": reset.group,
        "timestamp": str(reset.timestamp_ms),
        "isForce": "true",
    }
    return RemotingCommand(
        RequestCode.RESET_CONSUMER_CLIENT_OFFSET,
        flag=RPC_ONEWAY,
        ext_fields=fields,
        body=reset_offset_body(broker_name, reset.topic, reset.offsets),
    )


class ResetTracker:
    """Which groups' resets the server watches, and the queues whose offset reports are guarded.

    Thread-safe.
    """

    def __init__(self, store: Store) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._watchers: dict[str, ResetWatcher] = {}
        self._guards: dict[QueueKey, tuple[int, int]] = {}  # -> (reset offset, guarded until ms)

    def watch(self, group: str) -> None:
        """Watch ``group``'s resets from now on (a consumer of it connected); reads the store once.

        Raises:
            InvalidArgumentError: a bad group name.
            StoreError: the resets table cannot be read.
        """
        with self._lock:
            if group in self._watchers:
                return
        watcher = ResetWatcher(self._store, group)
        with self._lock:
            self._watchers.setdefault(group, watcher)

    def poll(self) -> list[GroupReset]:
        """Resets of the watched groups made since the last poll, one per (group, topic); each
        reset queue is guarded from then on. A group whose table read fails is asked again next
        time."""
        with self._lock:
            watchers = list(self._watchers.values())
        out: list[GroupReset] = []
        for watcher in watchers:
            try:
                fresh = watcher.poll()
            except Exception as exc:
                _log.warning("reading the resets of %s failed (asked again later): %s", watcher.group, exc)
                continue
            by_topic: dict[str, dict[int, int]] = {}
            for (topic, queue_id), row in fresh.items():
                by_topic.setdefault(topic, {})[queue_id] = row.offset
            for topic, offsets in sorted(by_topic.items()):
                out.append(GroupReset(watcher.group, topic, offsets))
        until = now_ms() + GUARD_MS
        with self._lock:
            for reset in out:
                for queue_id, offset in reset.offsets.items():
                    self._guards[(reset.group, reset.topic, queue_id)] = (offset, until)
        return out

    def admits(self, group: str, topic: str, queue_id: int, offset: int) -> bool:
        """Whether a client's offset report may be committed: not while its queue is guarded by a
        reset, unless it is the reset offset itself (the client followed the reset: the guard
        lifts)."""
        key = (group, topic, queue_id)
        with self._lock:
            guard = self._guards.get(key)
            if guard is None:
                return True
            reset_offset, until = guard
            if offset == reset_offset or now_ms() > until:
                del self._guards[key]
                return True
            return False

    def pulled(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """A client of ``group`` pulls the queue from ``offset``: from exactly a guarded queue's reset
        offset, it followed the reset (the guard lifts)."""
        if not self._guards:  # no reset guarded: nothing to look up (most pulls)
            return
        key = (group, topic, queue_id)
        with self._lock:
            guard = self._guards.get(key)
            if guard is not None and guard[0] == offset:
                del self._guards[key]
