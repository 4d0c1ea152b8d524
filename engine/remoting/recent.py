"""Recent messages in their wire encoding: pulls answered from memory, as RocketMQ's broker answers
them from its page cache.

The RocketMQ door keeps, per (topic, queue id, queue offset), what a pull response's body holds for
that message (:func:`encode`: the stored layout of :func:`~engine.remoting.wire_messages.to_wire`,
stamped with this endpoint's address), with the consume-queue entry's stored size and tags code,
up to ``wire_recent_bytes`` of the store's config (0: off; oldest first out). It is filled by what
the door's clients send, as their commits land (:func:`sent`: encoded when first pulled), and by
reads ahead of a pull that missed (:func:`read_ahead`: one read of the queue's next entries instead
of one per pull, for messages other doors stored or the door no longer holds), on the pull threads;
it is kept on the event loop: :class:`RecentMessages` has one owner, the endpoint's loop, which
alone reads and changes it.

A pull answered from it answers exactly what :meth:`~engine.client.pull.PullConsumer.pull` answers
for the same queue bounds (:meth:`RecentMessages.answer`): the bounds are the engine's own (its
index, refreshed as a pull refreshes it), RocketMQ's status checks and offset corrections
(:func:`~engine.protocol.pull.pull_status`), the same window, transfer limits and batch stop
(:func:`~engine.protocol.pull.batch_stop`), the same tag filter (tags code, then the tag itself).
What it holds is what the engine read, or what a client sent and the engine stored in the queue it
named, so nothing the engine would not serve (a half message, a delayed message before delivery) is
in it, and nothing is answered past the queue's end as the engine's index has it; offsets below the
queue's minimum (retention, a topic deleted and made again) are never answered from it, and a queue
whose end went back, or whose offset now names another message, is forgotten. SQL92 subscriptions
go through the engine.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from engine.client.sending import PreparedSend
from engine.config import EngineConfig
from engine.model import MessageExt, PullStatus, SendResult
from engine.protocol import RecordSizes, tags_code
from engine.protocol.pull import MAX_SCAN_ENTRIES, batch_full, pull_status
from engine.protocol.selectors import ExpressionType, MessageSelector
from engine.remoting.message_layout import encode_stored
from engine.remoting.wire_messages import encode_row, encode_rows, to_wire
from engine.store.consume_queue import QueueIndex

Queue = tuple[str, int]  # (topic, queue id)

# What one held message costs beyond its stored size (the entry, the keys, the dictionaries' slots).
ENTRY_OVERHEAD = 200
# A read ahead takes at most this many entries and this many stored bytes (the first whatever its size).
READ_AHEAD_ENTRIES = 1024
READ_AHEAD_BYTES = 8 * 1024 * 1024
# A pull answered with fewer than this many messages held past it starts the next read ahead, in the
# background, so the queue's reader does not wait for it.
READ_AHEAD_LOW = 512
# What a pull that finds its first message not held reads before it answers (the rest is read in
# the background): a reader starting far from the end of its queue does not wait for a long read.
READ_ON_MISS = 128


class Recent:
    """One message as a pull answers it: its wire encoding and its consume-queue entry's fields.

    A message held at its send (:func:`sent`) keeps the fields of its row instead, and is encoded
    when a pull first asks for it: the send pays for no encoding a consumer may never ask for.
    Two are equal when they answer the same bytes for the same entry.
    """

    __slots__ = ("_encoded", "_row", "physical_offset", "size", "tags", "tags_code")

    def __init__(
        self,
        encoded: bytes | None,
        size: int,
        tags: str | None,
        tags_code: int,
        physical_offset: int,
        row: tuple[Any, ...] | None = None,
    ) -> None:
        if encoded is None and row is None:
            raise ValueError("a held message needs its encoding or its row")
        self._encoded = encoded
        self._row = row  # encode_row's arguments, store host last
        self.size = size  # the stored size (the consume queue's ``size``: the transfer limit counts it)
        self.tags = tags
        self.tags_code = tags_code
        self.physical_offset = physical_offset

    @property
    def encoded(self) -> bytes:
        if self._encoded is None:
            assert self._row is not None
            *fields, host = self._row
            self._encoded, self._row = encode_row(*fields, store_host=host), None
        return self._encoded

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Recent):
            return NotImplemented
        return (self.encoded, self.size, self.tags, self.tags_code, self.physical_offset) == (
            other.encoded,
            other.size,
            other.tags,
            other.tags_code,
            other.physical_offset,
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Recent(size={self.size}, tags={self.tags!r}, physical_offset={self.physical_offset})"


@dataclass(frozen=True, slots=True)
class PullAnswer:
    """What a pull response carries: status, the messages' wire encoding, offset corrections."""

    status: PullStatus
    body: bytes
    next_begin_offset: int
    min_offset: int
    max_offset: int


def encode(m: MessageExt, store_host: tuple[str, int]) -> bytes:
    """A stored message as a pull response's body holds it."""
    return encode_stored(to_wire(m, store_host))


def read_ahead(
    index: QueueIndex,
    store_host: tuple[str, int],
    topic: str,
    queue_id: int,
    start: int,
    end: int,
    entries_limit: int = READ_AHEAD_ENTRIES,
) -> list[tuple[int, Recent]]:
    """The messages of queue offsets ``start <= offset < end`` as the engine reads them (entries,
    then commit-log rows, through ``index``), at most ``entries_limit`` and
    :data:`READ_AHEAD_BYTES` of them, encoded: (queue offset, message) in offset order. Blocking
    (a pull thread's work).

    Raises:
        StoreError: an entry's message is not readable.
    """
    end = min(end, start + entries_limit)
    if end <= start:
        return []
    entries = index.entries(topic, queue_id, start, end)
    if entries.num_rows == 0:
        return []
    sizes = entries["size"].to_pylist()
    taken, total = 0, 0
    for size in sizes:
        if taken and total + size > READ_AHEAD_BYTES:
            break
        taken += 1
        total += size
    entries = entries.slice(0, taken)
    rows = index.messages(entries["physical_offset"].to_pylist())
    return [
        (offset, Recent(encoded, size, tags, code, physical))
        for offset, size, code, encoded, tags, physical in zip(
            entries["queue_offset"].to_pylist(),
            sizes,
            entries["tags_code"].to_pylist(),
            encode_rows(rows, store_host),
            rows["tags"].to_pylist(),
            rows["physical_offset"].to_pylist(),
            strict=True,
        )
    ]


def sent(
    messages: Sequence[PreparedSend], results: Sequence[SendResult], store_host: tuple[str, int]
) -> list[tuple[int, Recent]]:
    """Messages a wire client sent, as a pull answers them, from what was committed (``messages``,
    in the order of their ``results``): held from their send on, a consumer that reads close
    behind its producers is answered without reading them back. A send stored elsewhere than it
    names (a delayed or timer message waits in the schedule topic) is left out.

    Nothing is encoded here (:class:`Recent`): a message whose encoding fails (a topic or
    properties too long for the layout) fails the pull that asks for it, as a read would.
    """
    out = []
    sized = RecordSizes()  # a client's batch shares one properties mapping: encoded once
    codes: dict[str | None, int] = {}
    for prepared, result in zip(messages, results, strict=True):
        m = prepared.pending
        if prepared.destination is not None:
            continue
        row = (
            m.topic,
            m.queue_id,
            result.queue_offset,
            result.physical_offset,
            result.offset_msg_id,
            m.uniq_key,
            m.body,
            m.tags,
            m.keys,
            m.properties,
            m.born_ts_ms or result.store_ts_ms,
            result.store_ts_ms,
            m.reconsume_times,
            m.sys_flag,
            store_host,
        )
        code = codes.get(m.tags)
        if code is None:
            code = codes[m.tags] = tags_code(m.tags)
        held = Recent(
            None, sized(m.topic, len(m.body), m.properties), m.tags, code, result.physical_offset, row
        )
        out.append((result.queue_offset, held))
    return out


class RecentMessages:
    """Recent messages of every queue, bounded by bytes (module docstring). Used on one event loop.

    Args:
        max_bytes: most bytes held (encodings plus :data:`ENTRY_OVERHEAD` each); 0 holds nothing.
        config: the store's config (the transfer limits a pull obeys).
    """

    def __init__(self, max_bytes: int, config: EngineConfig) -> None:
        self.max_bytes = max_bytes
        self._config = config
        self._queues: dict[Queue, dict[int, Recent]] = {}
        self._order: OrderedDict[tuple[str, int, int], int] = OrderedDict()  # oldest first -> cost
        self._ends: dict[Queue, int] = {}  # the highest queue end an answer was checked against
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        # Reads ahead under way, per queue (started and awaited by engine.remoting.handlers.pull).
        self.reading: dict[Queue, asyncio.Task[None]] = {}

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def __len__(self) -> int:
        return len(self._order)

    def holds(self, topic: str, queue_id: int, offset: int) -> bool:
        """Whether the message at ``offset`` of the queue is held."""
        held = self._queues.get((topic, queue_id))
        return held is not None and offset in held

    def missing_from(self, topic: str, queue_id: int, offset: int, within: int) -> int | None:
        """The first offset of ``offset <= o < offset + within`` not held, or None when all are."""
        held = self._queues.get((topic, queue_id))
        if held is None:
            return offset
        for at in range(offset, offset + within):
            if at not in held:
                return at
        return None

    def put(self, topic: str, queue_id: int, items: list[tuple[int, Recent]]) -> None:
        """Hold messages of one queue ((queue offset, message) pairs), the oldest held going out
        while more than ``max_bytes`` are held. A message at an offset held for another message
        (the queue was made again) forgets what the queue held."""
        if not self.enabled or not items:
            return
        key = (topic, queue_id)
        held = self._queues.get(key)
        for offset, item in items:
            if held is not None:
                old = held.get(offset)
                if old is not None and old.physical_offset != item.physical_offset:
                    self.forget(topic, queue_id)
                    held = None
            if held is None:
                held = self._queues.setdefault(key, {})
            cost = item.size + ENTRY_OVERHEAD  # (the stored size: about the encoding's, made or not)
            if offset in held:
                continue
            held[offset] = item
            self._order[(topic, queue_id, offset)] = cost
            self.bytes += cost
        self._evict()

    def _evict(self) -> None:
        while self.bytes > self.max_bytes and self._order:
            (topic, queue_id, offset), cost = self._order.popitem(last=False)
            self.bytes -= cost
            held = self._queues.get((topic, queue_id))
            if held is not None:
                held.pop(offset, None)
                if not held:
                    del self._queues[(topic, queue_id)]

    def forget(self, topic: str, queue_id: int | None = None) -> None:
        """Drop what is held of one queue (``queue_id``) or of every queue of ``topic``."""
        keys = [k for k in self._queues if k[0] == topic and (queue_id is None or k[1] == queue_id)]
        for key in keys:
            for offset in self._queues.pop(key):
                self.bytes -= self._order.pop((key[0], key[1], offset), 0)
            self._ends.pop(key, None)

    def clear(self) -> None:
        """Drop everything held."""
        self._queues.clear()
        self._order.clear()
        self._ends.clear()
        self.bytes = 0

    def answer(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_nums: int,
        selector: MessageSelector,
        min_offset: int,
        max_offset: int,
    ) -> PullAnswer | None:
        """What :meth:`~engine.client.pull.PullConsumer.pull` answers for this pull when the queue's
        bounds are ``(min_offset, max_offset)`` (the engine's, just refreshed), or None when the
        answer needs a message not held (or a SQL92 selector): then the engine answers.
        """
        if not self.enabled:
            return None
        key = (topic, queue_id)
        if max_offset < self._ends.get(key, 0):
            self.forget(topic, queue_id)  # the queue's end went back: made again, or truncated
        self._ends[key] = max_offset
        status, next_offset = pull_status(offset, min_offset, max_offset)
        if status is not None:
            return PullAnswer(status, b"", next_offset, min_offset, max_offset)
        matches_all = selector.matches_all
        tags = selector.tag_filter
        if not matches_all and (selector.type is not ExpressionType.TAG or tags is None):
            return None
        held = self._queues.get(key)
        if held is None:
            self.misses += 1
            return None
        config = self._config
        limit = min(max_nums, config.max_transfer_count)
        max_bytes = config.max_transfer_bytes
        window = limit if matches_all else max(MAX_SCAN_ENTRIES, max_nums)
        end = min(max_offset, offset + window)
        codes = tags.codes if tags is not None else frozenset()
        names = tags.tags if tags is not None else frozenset()
        count = taken_bytes = 0
        parts: list[bytes] = []
        position = end
        for at in range(offset, end):
            item = held.get(at)
            if item is None:
                self.misses += 1
                return None
            if batch_full(count, taken_bytes, item.size, limit, max_bytes):
                position = at
                break
            if matches_all or (item.tags_code in codes and item.tags in names):
                count += 1
                taken_bytes += item.size
                parts.append(item.encoded)
        self.hits += 1
        if not parts:
            return PullAnswer(PullStatus.NO_MATCHED_MSG, b"", position, min_offset, max_offset)
        return PullAnswer(PullStatus.FOUND, b"".join(parts), position, min_offset, max_offset)
