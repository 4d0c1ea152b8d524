"""The pull consumer: RocketMQ's pull API over the consume queue, with long polling."""

from __future__ import annotations

import time

from engine.errors import InvalidArgumentError
from engine.model import MessageExt, PullResult, PullStatus
from engine.protocol import validate_group_name
from engine.protocol.pull import MAX_PULL_NUMS, MAX_SCAN_ENTRIES, pull_status
from engine.protocol.selectors import MessageSelector
from engine.store.consume_queue import QueueIndex
from engine.store.consumer_offset import OffsetStore
from engine.store.store import Store


class PullConsumer:
    """Pulls messages by queue offset, as RocketMQ's ``DefaultMQPullConsumer``.

    Args:
        store: an open store.
        group: consumer group; offsets committed with :meth:`commit_offset` are the group's.
        index: the queue index to read through (default: one of its own). A server that pulls for
            many groups passes one index to all, so each new version is read once, not per group.
    """

    def __init__(self, store: Store, group: str, *, index: QueueIndex | None = None) -> None:
        self._store = store
        self.group = validate_group_name(group)
        self._index = QueueIndex(store) if index is None else index
        self._offsets = OffsetStore(store, self.group)

    def check_queue(self, topic: str, queue_id: int) -> None:
        """Check a queue as :meth:`pull` does before reading.

        Raises:
            TopicNotFoundError: no such topic.
            InvalidArgumentError: a queue id outside the topic's queues.
        """
        config = self._store.topic(topic)
        if isinstance(queue_id, bool) or not isinstance(queue_id, int) or not 0 <= queue_id < config.queues:
            raise InvalidArgumentError(
                f"queue_id {queue_id!r} is out of range; topic {topic!r} has queues 0..{config.queues - 1}",
                topic=topic,
                queue_id=queue_id,
            )

    def pull(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_nums: int = 32,
        expression: MessageSelector | str = "*",
        suspend_ms: int = 0,
    ) -> PullResult:
        """Pull up to ``max_nums`` messages from ``offset`` of one queue.

        Statuses and offset corrections are RocketMQ's: FOUND (next = past the entries examined),
        NO_NEW_MSG (offset == max_offset; next = offset), NO_MATCHED_MSG (every examined entry was
        filtered out; next = past them), OFFSET_ILLEGAL (below min: next = min; above max: next = max).

        As RocketMQ's broker, one pull returns at most ``max_transfer_count`` messages (32) and
        ``max_transfer_bytes`` (256 KiB of stored record sizes; the first message whatever its size)
        of the store's config, however large ``max_nums`` is; a filtering pull examines at most
        ``max(800, max_nums)`` entries.

        Args:
            topic: the topic.
            queue_id: the queue.
            offset: first queue offset wanted.
            max_nums: most messages returned (1..1024; capped by ``max_transfer_count``).
            expression: a :class:`MessageSelector` (``MessageSelector.by_sql("a > 5")``) or a tag
                expression, ``"*"`` or ``"TagA || TagB"``.
            suspend_ms: long polling: when there is nothing new at ``offset``, wait up to this long
                for a matching message to be dispatched. A pull that finds entries but none matching
                answers NO_MATCHED_MSG at once, as RocketMQ's broker does.

        Raises:
            TopicNotFoundError, InvalidArgumentError: bad arguments.
            InvalidSelectorError: a bad expression.
        """
        self.check_queue(topic, queue_id)
        if isinstance(offset, bool) or not isinstance(offset, int):
            raise InvalidArgumentError(f"offset {offset!r} must be an int", offset=offset)
        if isinstance(max_nums, bool) or not isinstance(max_nums, int) or not 1 <= max_nums <= MAX_PULL_NUMS:
            raise InvalidArgumentError(f"max_nums {max_nums!r} must be 1..{MAX_PULL_NUMS}", max_nums=max_nums)
        if isinstance(suspend_ms, bool) or not isinstance(suspend_ms, int) or suspend_ms < 0:
            raise InvalidArgumentError(
                f"suspend_ms {suspend_ms!r} must be an int >= 0", suspend_ms=suspend_ms
            )
        suspend_ms = min(suspend_ms, self._store.config.long_poll_max_ms)
        selector = MessageSelector.of(expression)
        self._catch_up(topic, queue_id, offset)
        result, examined = self._pull_once(topic, queue_id, offset, max_nums, selector)
        if (
            suspend_ms == 0
            or result.status is PullStatus.FOUND
            or result.status is PullStatus.OFFSET_ILLEGAL
            or (result.status is PullStatus.NO_MATCHED_MSG and examined)
        ):
            return result
        # Long polling: parked until dispatch adds a matching entry to this queue, or the time is up.
        deadline = time.monotonic() + suspend_ms / 1000
        interval = self._store.config.long_poll_interval_ms / 1000
        seen_max, seen_version = result.max_offset, self._index.version
        while time.monotonic() < deadline:
            time.sleep(min(interval, max(deadline - time.monotonic(), 0)))
            # The index is shared by every pull of this puller: another parked pull may have loaded
            # the new version, so compare versions rather than trust this refresh's answer.
            self._index.refresh()
            if self._index.version == seen_version:
                continue
            seen_version = self._index.version
            if self._index.bounds(topic, queue_id)[1] == seen_max:
                continue
            result, _ = self._pull_once(topic, queue_id, offset, max_nums, selector)
            seen_max = result.max_offset
            if result.status is not PullStatus.NO_NEW_MSG and result.status is not PullStatus.NO_MATCHED_MSG:
                return result
        return result

    def _catch_up(self, topic: str, queue_id: int, offset: int) -> None:
        local = self._store.is_local
        self._index.refresh(tail=local)
        if not local and offset >= self._index.bounds(topic, queue_id)[1]:
            self._index.refresh_tail()  # at the end of the queue: the commit-log versions not dispatched

    def bounds_now(self, topic: str, queue_id: int, offset: int) -> tuple[int, int]:
        """The (min_offset, max_offset) a :meth:`pull` from ``offset`` would read by, after the same
        refresh it makes: what a reader holding messages of the queue checks before answering in its
        place.

        Raises:
            TopicNotFoundError, InvalidArgumentError: bad arguments.
        """
        self.check_queue(topic, queue_id)
        self._catch_up(topic, queue_id, offset)
        return self._index.bounds(topic, queue_id)

    def _pull_once(
        self, topic: str, queue_id: int, offset: int, max_nums: int, selector: MessageSelector
    ) -> tuple[PullResult, int]:
        """One read of the queue: the result and how many consume-queue entries were examined."""
        min_offset, max_offset = self._index.bounds(topic, queue_id)
        status, next_offset = pull_status(offset, min_offset, max_offset)
        if status is not None:
            return PullResult(status, [], next_offset, min_offset, max_offset), 0
        config = self._store.config
        limit = min(max_nums, config.max_transfer_count)
        window = limit if selector.matches_all else max(MAX_SCAN_ENTRIES, max_nums)
        end = min(max_offset, offset + window)
        entries = self._index.entries(topic, queue_id, offset, end)
        if entries.num_rows == 0:
            return PullResult(PullStatus.NO_MATCHED_MSG, [], end, min_offset, max_offset), 0
        rows, stop = self._index.select(entries, selector, limit, config.max_transfer_bytes)
        offsets = entries["queue_offset"].to_numpy()
        position = int(offsets[stop]) if stop < len(offsets) else int(offsets[-1]) + 1
        if rows.num_rows == 0:
            return PullResult(PullStatus.NO_MATCHED_MSG, [], position, min_offset, max_offset), stop
        messages = [MessageExt.from_row(row) for row in rows.to_pylist()]
        return PullResult(PullStatus.FOUND, messages, position, min_offset, max_offset), stop

    def commit_offset(self, topic: str, queue_id: int, offset: int) -> None:
        """Record the group's consume progress of one queue (the next offset to consume)."""
        self.check_queue(topic, queue_id)
        self._offsets.commit([(topic, queue_id, offset)])

    def committed_offset(self, topic: str, queue_id: int) -> int | None:
        """The group's last committed offset of one queue, or None if it never committed."""
        self.check_queue(topic, queue_id)
        return self._offsets.read(topic).get((topic, queue_id))

    def max_offset(self, topic: str, queue_id: int) -> int:
        """Next offset to be dispatched in a queue."""
        self.check_queue(topic, queue_id)
        self._index.refresh()
        return self._index.bounds(topic, queue_id)[1]

    def min_offset(self, topic: str, queue_id: int) -> int:
        """Smallest offset still stored in a queue."""
        self.check_queue(topic, queue_id)
        self._index.refresh()
        return self._index.bounds(topic, queue_id)[0]
