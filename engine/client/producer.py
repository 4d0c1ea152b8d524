"""The producer: validates messages, chooses queues and appends them through the sequencer."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future

from engine.client.queue_choice import QueueChooser
from engine.client.sending import (
    as_sent,
    has_timer,
    is_plain,
    is_plain_batch,
    send_results,
    valid_topic_name,
    writeable_topic,
)
from engine.closing import Closing
from engine.errors import InvalidArgumentError, InvalidMessageError, MQError, ProducerClosedError, StoreError
from engine.model import Message, SendResult
from engine.protocol.delays import clamp_delay_level
from engine.protocol.message_ids import UniqKeyGenerator
from engine.protocol.messages import (
    batch_bytes,
    select_queue_by_hash,
    validate_message_fields,
)
from engine.protocol.names import (
    PROPERTY_KEYS,
    RESEND_PROPERTIES,
    TIMER_REQUEST_PROPERTIES,
    validate_group_name,
    validate_topic_name,
)
from engine.protocol.schedule import TIMER_PROPERTIES, schedule_envelope, timer_deliver_ms
from engine.store.commit_log import CommitLogs, CommitLogWriter, PendingBatch, PendingMessage, ShardPart
from engine.store.store import Store, now_ms


class Producer(Closing):
    """Sends messages to a store.

    Args:
        store: an open :class:`~engine.store.Store`.
        group: producer group name (informational, as in RocketMQ).
        linger_ms: how long :meth:`send_async` waits to fill a micro-batch.
        batch_size: most messages per async micro-batch (which also holds at most
            ``max_batch_bytes`` of bodies, as :meth:`send_batch`).

    A producer is thread-safe and may be used as a context manager; :meth:`close` flushes.
    """

    def __init__(
        self,
        store: Store,
        group: str = "DEFAULT_PRODUCER",
        *,
        linger_ms: int | None = None,
        batch_size: int | None = None,
    ) -> None:
        self._store = store
        self.group = validate_group_name(group)
        self.linger_ms = store.config.producer_linger_ms if linger_ms is None else linger_ms
        self.batch_size = store.config.producer_batch_size if batch_size is None else batch_size
        for name, value, low in (("linger_ms", self.linger_ms, 0), ("batch_size", self.batch_size, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise InvalidArgumentError(f"{name} {value!r} must be an int >= {low}", **{name: value})
        self._writer = CommitLogs(store)  # one sequencer per commit-log shard
        self._ids = UniqKeyGenerator()
        self._queues = QueueChooser(self._writer.shards, self._writer.shard_of, self._writer.lost_races)
        self._worker_lock = threading.Lock()
        self._closed = False
        self._pending: queue.Queue[tuple[PendingMessage, Future[SendResult]] | None] = queue.Queue()
        self._worker: threading.Thread | None = None

    # ----------------------------------------------------------------- preparing
    def _choose_queue(self, topic: str, queues: int, queue_id: int | None, sharding_key: str | None) -> int:
        if queue_id is not None:
            if isinstance(queue_id, bool) or not isinstance(queue_id, int) or not 0 <= queue_id < queues:
                raise InvalidArgumentError(
                    f"queue_id {queue_id!r} is out of range; topic {topic!r} has queues 0..{queues - 1}",
                    topic=topic,
                    queue_id=queue_id,
                )
            return queue_id
        if sharding_key is not None:
            if not isinstance(sharding_key, str) or not sharding_key:
                raise InvalidArgumentError("sharding_key must be a non-empty string", topic=topic)
            return select_queue_by_hash(sharding_key, queues)
        return self._queues.next(topic, queues)

    def _prepare(
        self,
        message: Message,
        queue_id: int | None = None,
        sharding_key: str | None = None,
        delay_level: int = 0,
        allowed: frozenset[str] = TIMER_REQUEST_PROPERTIES,
    ) -> PendingMessage:
        if not isinstance(message, Message):
            raise InvalidMessageError(f"expected engine.Message, got {type(message).__name__}")
        plain = is_plain(message)
        if not plain:  # the full check names what is wrong
            validate_message_fields(
                message.topic,
                message.body,
                message.tags,
                message.keys,
                message.properties,
                message.deliver_at_ms,
                allowed=allowed,
            )
        topic = writeable_topic(self._store, message.topic)
        delay_level = clamp_delay_level(delay_level)  # above 18: 18, as RocketMQ's broker
        qid = self._choose_queue(topic.name, topic.queues, queue_id, sharding_key)
        if plain and not delay_level:
            return PendingMessage(
                topic.name, qid, message.body, self._ids.next(), message.tags, born_ts_ms=now_ms()
            )
        props = dict(message.properties)
        keys = tuple(message.keys)
        if keys:
            props[PROPERTY_KEYS] = " ".join(keys)
        born = now_ms()
        uniq = self._ids.next()
        deliver_at = None
        if delay_level:  # a delay level wins over a timer (RocketMQ clears the timer properties)
            props = {k: v for k, v in props.items() if k not in TIMER_PROPERTIES}
        else:
            max_delay_ms = self._store.config.timer_max_delay_sec * 1000
            try:
                deliver_at = timer_deliver_ms(
                    props, message.deliver_at_ms, now_ms=born, max_delay_ms=max_delay_ms
                )
            except InvalidMessageError as exc:
                raise InvalidMessageError(str(exc), topic=topic.name) from None
        if deliver_at is None and not delay_level:
            return PendingMessage(topic.name, qid, bytes(message.body), uniq, message.tags, keys, props, born)
        # Delayed and timer messages wait in the schedule topic; the schedule job re-puts them.
        envelope = schedule_envelope(
            topic.name, qid, props, sent_ms=born, delay_level=delay_level, deliver_at_ms=deliver_at
        )
        return PendingMessage(
            body=bytes(message.body),
            uniq_key=uniq,
            tags=message.tags,
            keys=keys,
            born_ts_ms=born,
            **envelope._asdict(),
        )

    def _queue_writer(self, topic: str, queue_id: int) -> CommitLogWriter:
        """The writer of the commit-log shard holding a queue (a transaction decision re-puts its
        half into the real queue and commits its guard there)."""
        return self._writer.writer(self._writer.shard_of(topic, queue_id))

    def _check_open(self) -> None:
        if self._closed:
            raise ProducerClosedError("producer is closed")

    # ----------------------------------------------------------------- sending
    def send(
        self,
        message: Message,
        queue_id: int | None = None,
        sharding_key: str | None = None,
        *,
        delay_level: int = 0,
    ) -> SendResult:
        """Send one message synchronously: it is stored in one Delta commit when this returns.

        Args:
            message: what to send.
            queue_id: an explicit queue; default round robin over the topic's queues.
            sharding_key: choose the queue by a stable hash of this key (ordered messages), as
                Java's ``SelectMessageQueueByHash``.
            delay_level: 1..18, RocketMQ's delay levels (higher: clamped to 18); 0 sends at once,
                or as a timer when ``message.deliver_at_ms`` or a ``TIMER_DELAY_SEC`` /
                ``TIMER_DELAY_MS`` / ``TIMER_DELIVER_MS`` property says so (at most
                ``timer_max_delay_sec`` ahead; a time already past sends at once).

        Returns:
            Where the message was stored: ``msg_id`` is its client unique id, ``offset_msg_id``
            the store's offset id; a delayed or timer message's result names its real topic and
            queue (its queue offset is the schedule queue's, as RocketMQ's broker answers).

        Raises:
            InvalidMessageError, InvalidTopicError, TopicNotFoundError, InvalidArgumentError: bad
                input; nothing is written.
            CommitConflictError, StoreError, CommitStateUnknownError: the store refused the write.
        """
        self._check_open()
        pending = self._prepare(message, queue_id, sharding_key, delay_level)
        return as_sent(send_results(self._writer.append_batch([pending]))[0], pending)

    def _resend(self, message: Message) -> SendResult:
        """:meth:`send` of a broker-side copy (a dead letter sent back), which may carry the
        reserved properties :data:`~engine.protocol.names.RESEND_PROPERTIES`."""
        self._check_open()
        pending = self._prepare(message, allowed=RESEND_PROPERTIES | TIMER_REQUEST_PROPERTIES)
        return as_sent(send_results(self._writer.append_batch([pending]))[0], pending)

    def send_batch(self, messages: Sequence[Message], queue_id: int | None = None) -> list[SendResult]:
        """Send several messages of one topic in one Delta commit; results in input order.

        As RocketMQ's batch send: one topic, no delay, at most ``max_batch_bytes`` (4 MiB) in all.
        Without ``queue_id`` the whole batch goes to one queue, chosen round robin.

        Raises:
            InvalidMessageError: mixed topics, a delayed message, or a batch too large; nothing is written.
        """
        self._check_open()
        if isinstance(messages, Message) or not isinstance(messages, Sequence):
            raise InvalidMessageError("send_batch takes a sequence of Message")
        if not messages:
            return []
        first = messages[0]
        if (
            type(first) is Message
            and type(first.topic) is str
            and valid_topic_name(first.topic)
            and is_plain_batch(messages, first.topic)
        ):
            return self._send_plain_batch(first.topic, messages, queue_id)
        if not all(isinstance(m, Message) for m in messages):
            kinds = sorted({type(m).__name__ for m in messages})
            raise InvalidMessageError(
                f"a batch holds messages of exactly one topic, got items of types {kinds}"
            )
        first_topic = messages[0].topic
        if any(type(m.topic) is not type(first_topic) or m.topic != first_topic for m in messages):
            topics = sorted({repr(m.topic) for m in messages})
            raise InvalidMessageError(f"a batch holds messages of exactly one topic, got {', '.join(topics)}")
        validate_topic_name(first_topic)
        if any(m.deliver_at_ms is not None or has_timer(m.properties) for m in messages):
            raise InvalidMessageError("a batch cannot hold delayed or timer messages")
        for m in messages:
            if not is_plain(m):  # the full check names what is wrong
                validate_message_fields(m.topic, m.body, m.tags, m.keys, m.properties)
        total = sum(batch_bytes(m.body, m.tags, m.properties, m.keys) for m in messages)
        limit = self._store.config.max_batch_bytes
        if total > limit:
            raise InvalidMessageError(
                f"batch takes {total} bytes (bodies and properties, tags and keys included); at most "
                f"{limit} are allowed"
            )
        qid, topic_name = self._batch_queue(first_topic, queue_id)
        bodies: list[bytes] = []
        tags: list[str | None] = []
        keys: list[list[str]] = []
        props: list[list[tuple[str, str]]] = []
        for m in messages:
            bodies.append(bytes(m.body))
            tags.append(m.tags)
            key_list = list(m.keys)
            keys.append(key_list)
            if key_list:
                props.append([*m.properties.items(), (PROPERTY_KEYS, " ".join(key_list))])
            else:
                props.append(list(m.properties.items()) if m.properties else [])
        uniq = self._ids.next_many(len(bodies))
        batch = PendingBatch.single_queue(topic_name, qid, bodies, uniq, tags, keys, props, now_ms())
        return send_results(self._writer.append_batch(batch))

    def _batch_queue(self, topic_name: str, queue_id: int | None) -> tuple[int, str]:
        topic = writeable_topic(self._store, topic_name)
        return self._choose_queue(topic.name, topic.queues, queue_id, None), topic.name

    def _send_plain_batch(
        self, topic_name: str, messages: Sequence[Message], queue_id: int | None
    ) -> list[SendResult]:
        """:meth:`send_batch` of plain messages (checked by :func:`is_plain_batch`): columns at once."""
        bodies = [m.body for m in messages]
        tags = [m.tags for m in messages]
        # As RocketMQ's MessageBatch: a tag travels as the property TAGS\x01<tag>\x02 (6 bytes + tag).
        present = [t for t in tags if t is not None]
        total = sum(map(len, bodies)) + len("".join(present).encode()) + 6 * len(present)
        limit = self._store.config.max_batch_bytes
        if total > limit:
            raise InvalidMessageError(
                f"batch takes {total} bytes (bodies and tags); at most {limit} are allowed"
            )
        qid, name = self._batch_queue(topic_name, queue_id)
        uniq = self._ids.next_many(len(bodies))
        batch = PendingBatch.single_queue(name, qid, bodies, uniq, tags, None, None, now_ms())
        return send_results(self._writer.append_batch(batch))

    def send_async(
        self, message: Message, queue_id: int | None = None, sharding_key: str | None = None
    ) -> Future[SendResult]:
        """Queue a message for a micro-batch; the future resolves once its commit lands.

        Messages are grouped by ``linger_ms`` and ``batch_size`` into one commit each. Validation
        errors raise here, before anything is queued; store errors resolve the future.
        """
        self._check_open()
        return self._enqueue(self._prepare(message, queue_id, sharding_key))

    def _enqueue(self, pending: PendingMessage) -> Future[SendResult]:
        """Hand a checked message to the async worker; the future resolves once its commit lands."""
        future: Future[SendResult] = Future()
        self._ensure_worker()
        self._pending.put((pending, future))
        return future

    def _ensure_worker(self) -> None:
        if self._worker is None:
            with self._worker_lock:
                if self._worker is None:
                    self._worker = threading.Thread(target=self._run_async, name="mq-producer", daemon=True)
                    self._worker.start()

    def _run_async(self) -> None:
        limit = self._store.config.max_batch_bytes
        carry: tuple[PendingMessage, Future[SendResult]] | None = None
        stop = False
        while not stop:
            item = carry if carry is not None else self._pending.get()
            carry = None
            if item is None:
                self._pending.task_done()
                break
            batch = [item]
            size = len(item[0].body)
            deadline = time.monotonic() + self.linger_ms / 1000
            while len(batch) < self.batch_size:
                timeout = deadline - time.monotonic()
                try:
                    nxt = (
                        self._pending.get(timeout=max(timeout, 0))
                        if timeout > 0
                        else self._pending.get_nowait()
                    )
                except queue.Empty:
                    break
                if nxt is None:
                    self._pending.task_done()
                    stop = True
                    break
                size += len(nxt[0].body)
                if size > limit:  # as send_batch: at most max_batch_bytes of bodies per commit
                    carry = nxt
                    break
                batch.append(nxt)
            self._commit_async(batch)

    def _commit_async(self, batch: list[tuple[PendingMessage, Future[SendResult]]]) -> None:
        """Commit a group of sends, one commit per commit-log shard its queues live in: each
        shard's commit resolves its own futures (stored, or failed and in no commit)."""
        messages = [p for p, _ in batch]
        try:
            if self._writer.shards == 1:  # one commit, whose error fails the whole group
                parts = [ShardPart(0, list(range(len(batch))), self._writer.append_batch(messages), None)]
            else:
                parts = self._writer.commit_parts(messages)
            for part in parts:
                if part.error is not None:
                    for i in part.positions:
                        batch[i][1].set_exception(part.error)
                    continue
                assert part.stamped is not None
                for i, result in zip(part.positions, send_results(part.stamped), strict=True):
                    pending, fut = batch[i]
                    fut.set_result(as_sent(result, pending))
        except MQError as exc:
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(exc)
        except Exception as exc:  # keep the worker alive; surface as a store error
            err = StoreError(f"async send failed: {exc}", cause=exc)
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(err)
        self._tasks_done(len(batch))

    def _tasks_done(self, n: int) -> None:
        """``task_done()`` ``n`` times under one lock acquisition (Queue's own counter and condition)."""
        done = self._pending.all_tasks_done
        with done:
            unfinished = self._pending.unfinished_tasks - n
            if unfinished < 0:  # pragma: no cover - as Queue.task_done
                raise ValueError("task_done() called too many times")
            self._pending.unfinished_tasks = unfinished
            if unfinished == 0:
                done.notify_all()

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every message given to :meth:`send_async` is committed or failed.

        Raises:
            InvalidArgumentError: ``timeout`` is not a number of seconds >= 0.
            TimeoutError: sends are still in flight after ``timeout`` seconds.
        """
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout >= 0
        ):
            raise InvalidArgumentError(
                f"timeout {timeout!r} must be a number of seconds >= 0", timeout=timeout
            )
        if timeout is None:
            self._pending.join()
            return
        end = time.monotonic() + timeout
        with self._pending.all_tasks_done:
            while self._pending.unfinished_tasks:
                remaining = end - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"{self._pending.unfinished_tasks} async sends still in flight")
                self._pending.all_tasks_done.wait(remaining)

    def close(self) -> None:
        """Flush pending async sends and stop; later sends raise :class:`ProducerClosedError`."""
        if self._closed:
            return
        self.flush()
        self._closed = True
        if self._worker is not None:
            self._pending.put(None)
            self._worker.join(timeout=10)
        self._writer.close()
