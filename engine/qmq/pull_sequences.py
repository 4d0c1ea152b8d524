"""QMQ consumers' pull-log sequences: what the door hands out is numbered exactly as the pull log.

The pull-log job (:mod:`engine.broker.pull_log`) numbers each (group, consumer)'s pulled offsets
0, 1, 2, … in the order of its ``PULL`` rows (action-log version, then the consumer's action
sequence), one per leased offset. The door hands a QMQ consumer messages by committing, in one
lease commit of one queue, one single-offset ``PULL`` row per message it hands out (never a range,
never more than it hands out), each consumer through its own :class:`ActionLogWriter`, one pull at
a time. So the k-th offset this consumer was handed is pull sequence k in the job's numbering too:
the door's counter and the pull log agree at every instant, with nothing but the action log to
keep. A restarted door recounts the consumer's ``PULL`` rows (:func:`pulled_offsets`).

An ``ACK_REQUEST`` names pull sequences ``begin..last``; they map back to queue offsets through
the same numbering and are acked as the lease book's ``ACK`` rows.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.client.offsets import ConsumeFrom, offset_by_time, start_offset
from engine.errors import CommitConflictError, TopicNotFoundError
from engine.model import MessageExt
from engine.protocol.actions import ACK, PULL, RESET
from engine.protocol.selectors import MessageSelector
from engine.store.action_log import ActionLogWriter, read_actions
from engine.store.consume_queue import QueueIndex
from engine.store.consumer_offset import OffsetStore
from engine.store.store import Store, now_ms

# A handed-out message stays this QMQ consumer's until acked or this long: QMQ takes a consumer
# offline after 3 minutes without a heartbeat.
LEASE_MS = 180_000
LEASE_ATTEMPTS = 8  # lease commits of one queue per pull (lost races, batches the filter took all of)


@dataclass(frozen=True)
class Pulled:
    """One message handed out: its pull sequence and where it is in its queue."""

    sequence: int
    topic: str
    queue_id: int
    queue_offset: int
    deadline_ms: int


def pulled_offsets(rows: list[dict[str, Any]], consumer_id: str) -> list[tuple[str, int, int, int]]:
    """(topic, queue id, offset, deadline) of every offset a consumer was handed, in pull-sequence
    order, from its group's ``PULL`` rows ordered by sequence (as :func:`read_actions` returns
    them). Pure."""
    out: list[tuple[str, int, int, int]] = []
    for row in rows:
        if row["consumer_id"] != consumer_id or row["action"] != PULL:
            continue
        start = int(row["queue_offset"])
        end = row.get("end_offset")
        stop = start + 1 if end is None else int(end)
        deadline = int(row.get("deadline_ms") or 0)
        out.extend((str(row["topic"]), int(row["queue_id"]), o, deadline) for o in range(start, stop))
    return out


class QmqConsumer:
    """One QMQ consumer (group, consumer id): its action-log writer, its next pull sequence, and
    what each sequence it handed out stands for. Thread-safe (one pull or ack at a time)."""

    def __init__(
        self,
        store: Store,
        group: str,
        consumer_id: str,
        index: QueueIndex,
        since_ms: int | None = None,
        lease_ms: int = LEASE_MS,
    ) -> None:
        self.store = store
        self.lease_ms = lease_ms
        # A broadcast consumer (QMQ's ``isBroadcast``; its group is its own): what it is handed is
        # acked in the same commit, as QMQ's broker ignores a broadcast consumer's acks and never
        # hands its messages on.
        self.broadcast = False
        self._started: set[str] = set()  # topics whose every queue has the group's start fixed
        # When it last pulled or acked: QMQ's broker renews a subscriber on both
        # (``SubscriberStatusChecker.heartbeat``) and hands on what it holds once it is silent.
        self.last_active_ms = now_ms()
        # QMQ's rule for a group new to a subject: it starts at the latest message. A queue the
        # group never leased from starts at the first message stored at or after ``since_ms`` (when
        # the door first saw the group on the subject); None: at the first message (retry subjects).
        self.since_ms = since_ms
        self.group = group
        self.consumer_id = consumer_id
        self.writer = ActionLogWriter(store, group, consumer_id)
        self.index = index
        self.lock = threading.Lock()
        self._handed: dict[int, Pulled] | None = None
        self.next_sequence = 0
        self._turn = 0

    def _load(self) -> dict[int, Pulled]:
        if self._handed is None:
            rows = read_actions(self.store, self.group, PULL)
            found = pulled_offsets(rows, self.consumer_id)
            acked = {
                (topic, qid, off)
                for topic, qid, off, _ in pulled_offsets(
                    [{**r, "action": PULL} for r in read_actions(self.store, self.group, ACK)],
                    self.consumer_id,
                )
            }
            self._handed = {
                seq: Pulled(seq, topic, qid, off, deadline)
                for seq, (topic, qid, off, deadline) in enumerate(found)
                if (topic, qid, off) not in acked
            }
            self.next_sequence = len(found)
            mine = [r for r in rows if r["consumer_id"] == self.consumer_id]
            if mine:
                self.writer.known_sequence(max(int(r["sequence"]) for r in mine))
        return self._handed

    def pull(
        self,
        topic: str,
        max_messages: int,
        consumer_last: int = -1,
        keep: Callable[[MessageExt], bool] | None = None,
    ) -> tuple[int, list[tuple[Pulled, MessageExt]]]:
        """Hand out up to ``max_messages`` of ``topic``: the first pull sequence and the messages,
        numbered from it. Nothing when the topic is missing or has nothing new.

        As QMQ's broker (``findUnAckMessages``): when this consumer was handed sequences past
        ``consumer_last`` (the highest the client knows of: -1 for a client that restarted) that
        it has not acked, those come again first, under the same sequences. Otherwise new messages
        are leased (one queue per call, the queues in turn) under the next sequences; those that
        ``keep`` refuses (a tag filter) are acked in the same commit and get no sequence.

        Raises:
            StoreError: the store failed.
        """
        with self.lock:
            self.last_active_ms = max(self.last_active_ms, now_ms())
            handed = self._load()
            again = self._unacked_after(handed, consumer_last, max(1, max_messages))
            if again:
                return again[0][0].sequence, again
            config = self.store.topic_configs().get(topic) or self.store.topic_configs(refresh=True).get(
                topic
            )
            if config is None:
                return self.next_sequence, []
            self.index.refresh()
            queues = list(range(config.queues))
            self._turn += 1
            for queue_id in queues[self._turn % len(queues) :] + queues[: self._turn % len(queues)]:
                got = self._lease(topic, queue_id, max(1, max_messages), keep)
                if got:
                    for pulled, _ in got:
                        if not self.broadcast:
                            handed[pulled.sequence] = pulled
                    return got[0][0].sequence, got
            return self.next_sequence, []

    def _unacked_after(
        self, handed: dict[int, Pulled], consumer_last: int, limit: int
    ) -> list[tuple[Pulled, MessageExt]]:
        """The first run of consecutive unacked sequences past ``consumer_last`` whose messages the
        store still holds, at most ``limit`` (the client numbers a batch from its first)."""
        later = sorted(seq for seq in handed if seq > consumer_last)
        out: list[tuple[Pulled, MessageExt]] = []
        for seq in later:
            if len(out) >= limit or (out and seq != out[-1][0].sequence + 1):
                break
            pulled = handed[seq]
            message = self._message_at(pulled.topic, pulled.queue_id, pulled.queue_offset)
            if message is None:
                if out:
                    break
                continue
            out.append((pulled, message))
        return out

    def message(self, pulled: Pulled) -> MessageExt | None:
        """The stored message a handed-out sequence stands for (None: removed by retention)."""
        return self._message_at(pulled.topic, pulled.queue_id, pulled.queue_offset)

    def _message_at(self, topic: str, queue_id: int, offset: int) -> MessageExt | None:
        self.index.refresh()
        entries = self.index.entries(topic, queue_id, offset, offset + 1)
        if entries.num_rows == 0:
            return None
        found, _ = self.index.select(entries, MessageSelector.by_tag("*"))
        rows = found.to_pylist()
        return MessageExt.from_row(rows[0]) if rows else None

    def _first_offset(self, topic: str, queue_id: int) -> int:
        committed = OffsetStore(self.store, self.group).read().get((topic, queue_id))
        if committed is not None:
            return committed
        if self.since_ms is None:
            return start_offset(
                self.index, topic, queue_id, ConsumeFrom.FIRST, timestamp_ms=0, store=self.store, pop=True
            )
        return offset_by_time(self.index, topic, queue_id, self.since_ms)

    def fix_start(self, topic: str) -> int:
        """Record where the group starts in every queue of ``topic`` it never leased from (a
        ``RESET`` row and its lease frontier; see ``since_ms``), so that the start survives a
        restart of the door. Returns the number of queues fixed (0: a missing topic, or every queue
        had its start already; a topic found so is not read again by this consumer).

        Raises:
            StoreError: the store failed.
        """
        if topic in self._started:
            return 0
        config = self.store.topic_configs(refresh=True).get(topic)
        if config is None:
            return 0
        fixed = 0
        with self.lock:
            started = 0
            self.index.refresh()
            for queue_id in range(config.queues):
                for _ in range(LEASE_ATTEMPTS):
                    if self.writer.frontier(topic, queue_id, refresh=True) >= 0:
                        started += 1
                        break
                    start = max(self._first_offset(topic, queue_id), self.index.bounds(topic, queue_id)[0])
                    row = self.writer.row(RESET, topic, queue_id, start, ts=now_ms())
                    try:
                        self.writer.commit_lease([row], topic, queue_id, start)
                    except CommitConflictError:
                        continue
                    fixed += 1
                    started += 1
                    break
            if started == config.queues:
                self._started.add(topic)
        return fixed

    def _lease(
        self, topic: str, queue_id: int, size: int, keep: Callable[[MessageExt], bool] | None
    ) -> list[tuple[Pulled, MessageExt]]:
        writer = self.writer
        for _ in range(LEASE_ATTEMPTS):
            low, high = self.index.bounds(topic, queue_id)
            ts = now_ms()
            start, rows = writer.lease_start(
                topic, queue_id, low, lambda: self._first_offset(topic, queue_id), ts=ts, refresh=True
            )
            if start >= high:
                return []
            entries = self.index.entries(topic, queue_id, start, min(high, start + size))
            if entries.num_rows == 0:
                return []
            end = int(entries["queue_offset"][-1].as_py()) + 1
            found, _ = self.index.select(entries, MessageSelector.by_tag("*"))
            messages = {int(r["physical_offset"]): MessageExt.from_row(r) for r in found.to_pylist()}
            deadline = ts + self.lease_ms
            out: list[tuple[Pulled, MessageExt]] = []
            sequence = self.next_sequence
            for offset, physical in zip(
                entries["queue_offset"].to_pylist(), entries["physical_offset"].to_pylist(), strict=True
            ):
                message = messages.get(int(physical))
                if message is None:
                    continue
                if keep is not None and not keep(message):
                    rows.append(writer.row(ACK, topic, queue_id, offset, physical_offset=physical, ts=ts))
                    continue
                rows.append(
                    writer.row(
                        PULL, topic, queue_id, offset, physical_offset=physical, deadline_ms=deadline, ts=ts
                    )
                )
                if self.broadcast:
                    rows.append(writer.row(ACK, topic, queue_id, offset, physical_offset=physical, ts=ts))
                out.append((Pulled(sequence, topic, queue_id, offset, deadline), message))
                sequence += 1
            try:
                writer.commit_lease(rows, topic, queue_id, end)
            except CommitConflictError:
                continue
            self.next_sequence = sequence
            if out:
                return out
        return []  # nothing new, lost races, or only filtered messages (acked) so far

    def ack(self, begin: int, last: int) -> int:
        """Ack the messages handed out as pull sequences ``begin..last``; returns how many were
        known and acked (sequences never handed out are ignored, as QMQ's broker ignores an
        ack below what it already acked).

        Raises:
            StoreError: the write failed.
        """
        if begin < 0 or last < begin:
            return 0
        with self.lock:
            handed = self._load()
            ts = now_ms()
            self.last_active_ms = max(self.last_active_ms, ts)
            acked = 0
            for seq in range(begin, last + 1):
                pulled = handed.pop(seq, None)
                if pulled is None:
                    continue
                self.writer.buffer_ack(
                    ACK, pulled.topic, pulled.queue_id, pulled.queue_offset, pulled.deadline_ms, ts
                )
                acked += 1
            if acked:
                self.writer.flush()
            return acked

    def unacked(self) -> list[Pulled]:
        """What this consumer was handed and has not acked (as far as this door knows)."""
        with self.lock:
            return sorted(self._load().values(), key=lambda p: p.sequence)

    def close(self) -> None:
        self.writer.close()


def check_topic(store: Store, topic: str) -> None:
    """Raises TopicNotFoundError when ``topic`` does not exist."""
    if store.topic_configs().get(topic) is None and store.topic_configs(refresh=True).get(topic) is None:
        raise TopicNotFoundError(f"topic {topic!r} does not exist", topic=topic)
