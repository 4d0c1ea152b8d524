"""The producer: validates messages, chooses queues and appends them through the sequencer."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import Future

from engine.client.async_commits import AsyncCommits
from engine.client.sending import (
    PreparedSend,
    has_timer,
    is_plain,
    is_plain_batch,
    send_results,
    sent_result,
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
    message_group_queue,
    select_queue_by_hash,
    validate_message_fields,
)
from engine.protocol.names import (
    PROPERTY_KEYS,
    PROPERTY_SHARDING_KEY,
    RESEND_PROPERTIES,
    TIMER_REQUEST_PROPERTIES,
    validate_group_name,
    validate_topic_name,
)
from engine.protocol.queue_choice import QueueChooser
from engine.protocol.rebalance import MessageQueue
from engine.protocol.schedule import TIMER_PROPERTIES, schedule_envelope, timer_deliver_ms
from engine.protocol.transactions import HalfMessage, LocalTransactionState
from engine.store.commit_log import LOCK_WAIT_S, CommitLogs, PendingBatch, PendingMessage, ShardPart
from engine.store.store import Store, now_ms
from engine.store.transactions import Decision, end_transaction, half_message, half_writer, stored_half

# What a resent broker-side copy (a dead letter sent back) may carry besides a user's properties.
_RESEND_ALLOWED = RESEND_PROPERTIES | TIMER_REQUEST_PROPERTIES


DOOR_REGROUP_MS = 2
"""The ``regroup_ms`` of the doors' producers: about a client's turnaround from an acknowledgement to
its next send, so a synchronous client's threads acknowledged by one commit share the next one."""


def _stored_properties(
    message: Message, broker_properties: Mapping[str, str] | None
) -> tuple[tuple[str, ...], dict[str, str]]:
    """A message's keys, and the properties it is stored with: its own, the broker's a door adds,
    and its keys as ``KEYS`` (as RocketMQ's producer sends them)."""
    props = dict(message.properties)
    if broker_properties:
        props.update(broker_properties)
    keys = tuple(message.keys)
    if keys:
        props[PROPERTY_KEYS] = " ".join(keys)
    return keys, props


def _checked_batch(messages: Sequence[Message]) -> str:
    """The topic of a batch's messages, checked as a batch send checks them: all messages of one
    valid topic, none delayed or timed, each message's own fields.

    Raises:
        InvalidMessageError, InvalidTopicError: what is wrong with them.
    """
    if not all(isinstance(m, Message) for m in messages):
        kinds = sorted({type(m).__name__ for m in messages})
        raise InvalidMessageError(f"a batch holds messages of exactly one topic, got items of types {kinds}")
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
    return first_topic


def _checked(prepared: object) -> PreparedSend:
    """``prepared`` if it is a send :meth:`Producer.prepare` made.

    Raises:
        InvalidArgumentError: anything else.
    """
    if not isinstance(prepared, PreparedSend) or not isinstance(prepared.pending, PendingMessage):
        raise InvalidArgumentError(
            f"expected a prepared send (Producer.prepare), got {type(prepared).__name__}"
        )
    return prepared


class Producer(Closing):
    """Sends messages to a store.

    Args:
        store: an open :class:`~engine.store.Store`.
        group: producer group name (informational, as in RocketMQ).
        linger_ms: how long :meth:`send_async` waits to fill a micro-batch.
        batch_size: most messages per async micro-batch (which also holds at most
            ``max_batch_bytes`` of bodies, as :meth:`send_batch`).
        regroup_ms: how long the next micro-batch may wait, beyond ``linger_ms``, for the senders
            of the last one to send again (0: not at all). A client that sends synchronously from
            several threads has each thread's next send arrive just after its commit; committing
            whatever waits at once splits those threads into two halves that take turns, each
            commit carrying half of them. Waiting for as many sends as the last commit carried
            plus those that arrived during it gathers them into one commit again: fewer, fuller
            commits. A single synchronous sender never waits (it is all the last commit carried).
        lock_wait_s: on a local store, longest a commit queues for the host lock of the
            commit-log writers before it goes on without it (optimistically, still correct);
            default 10 s (:data:`~engine.store.commit_log.LOCK_WAIT_S`). A holder that stopped (SIGSTOP,
            a debugger) delays the commits this long once, then not until it lets go.

    A producer is thread-safe and may be used as a context manager; :meth:`close` flushes.

    Every send is "prepare, then append": :meth:`prepare` checks a message, chooses its queue and
    builds the row to store (and the schedule envelope of a delayed or timer message) without
    writing; :meth:`append`, :meth:`append_batch`, :meth:`append_async` and :meth:`commit_groups`
    commit prepared sends;
    :meth:`append_half` and :meth:`end_transaction` store and decide a transactional one. The
    ``send*`` methods are that seam with the checks a user's call needs; other senders (the wire
    protocol's producer, a DLQ resend) use the seam directly. For subclasses: ``_store`` is the
    store and ``_check_open()`` raises :class:`ProducerClosedError` once the producer is closed.
    """

    def __init__(
        self,
        store: Store,
        group: str = "DEFAULT_PRODUCER",
        *,
        linger_ms: int | None = None,
        batch_size: int | None = None,
        regroup_ms: int = 0,
        lock_wait_s: float = LOCK_WAIT_S,
    ) -> None:
        self._store = store
        self.group = validate_group_name(group)
        self.linger_ms = store.config.producer_linger_ms if linger_ms is None else linger_ms
        self.batch_size = store.config.producer_batch_size if batch_size is None else batch_size
        self.regroup_ms = regroup_ms
        for name, value, low in (
            ("linger_ms", self.linger_ms, 0),
            ("batch_size", self.batch_size, 1),
            ("regroup_ms", regroup_ms, 0),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise InvalidArgumentError(f"{name} {value!r} must be an int >= {low}", **{name: value})
        if isinstance(lock_wait_s, bool) or not isinstance(lock_wait_s, int | float) or not lock_wait_s >= 0:
            raise InvalidArgumentError(
                f"lock_wait_s {lock_wait_s!r} must be a number of seconds >= 0", lock_wait_s=lock_wait_s
            )
        self.lock_wait_s = lock_wait_s
        self._writer = CommitLogs(store, lock_wait_s=lock_wait_s)  # one sequencer per commit-log shard
        self._ids = UniqKeyGenerator()
        self._queues = QueueChooser(self._writer.shards, self._writer.shard_of, self._writer.lost_races)
        self._closed = False
        self._async = AsyncCommits(
            self._commit_groups,
            linger_ms=self.linger_ms,
            batch_size=self.batch_size,
            regroup_ms=regroup_ms,
            max_bytes=store.config.max_batch_bytes,
        )

    @property
    def lost_races(self) -> int:
        """Commits this producer's sequencers had to make again because another writer took the
        version first (each then caught up and stamped its batch again)."""
        return self._writer.conflicts

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

    def prepare(
        self,
        message: Message,
        queue_id: int | None = None,
        sharding_key: str | None = None,
        *,
        delay_level: int = 0,
        uniq_key: str | None = None,
        resend: bool = False,
        born_ts_ms: int | None = None,
        broker_properties: Mapping[str, str] | None = None,
        message_group: str | None = None,
    ) -> PreparedSend:
        """Check a message and choose its queue, writing nothing: the first half of a send.

        ``send(message, ...)`` is ``append(prepare(message, ...))``.

        Args:
            message, queue_id, sharding_key, delay_level: as :meth:`send` (a delayed or timer
                message is wrapped in its schedule envelope here).
            uniq_key: the client unique id to store (a wire client's ``UNIQ_KEY``, which its
                ``SendResult.msg_id`` reports); None or empty: a new one.
            resend: a broker-side copy (a dead letter sent back), which may carry the reserved
                properties :data:`~engine.protocol.names.RESEND_PROPERTIES`.
            born_ts_ms: when the message was born (a wire client's ``bornTimestamp``); None: now.
            broker_properties: reserved properties a door stores with the message, added after
                the message's own were checked (a wire client's born host and flag).
            message_group: as :meth:`send`.

        Returns:
            The send, for :meth:`append`, :meth:`append_batch`, :meth:`append_async` or
            :meth:`append_half`.

        Raises:
            ProducerClosedError: the producer is closed.
            InvalidMessageError, InvalidTopicError, TopicNotFoundError, InvalidArgumentError: bad
                input.
        """
        self._check_open()
        if uniq_key is not None and type(uniq_key) is not str:
            raise InvalidArgumentError(f"uniq_key {uniq_key!r} must be a string", uniq_key=uniq_key)
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
                allowed=_RESEND_ALLOWED if resend else TIMER_REQUEST_PROPERTIES,
            )
        topic = writeable_topic(self._store, message.topic)
        if type(delay_level) is not int or delay_level:  # the usual 0 needs no check (hot path)
            delay_level = clamp_delay_level(delay_level)  # above 18: 18, as RocketMQ's broker
        if message_group is not None:
            if queue_id is not None or sharding_key is not None:
                raise InvalidArgumentError(
                    "message_group chooses the queue: give no queue_id or sharding_key with it",
                    topic=topic.name,
                )
            qid = message_group_queue(message_group, topic.queues)
            broker_properties = {**(broker_properties or {}), PROPERTY_SHARDING_KEY: message_group}
        elif queue_id is None and sharding_key is None:  # the usual round robin, one call less
            qid = self._queues.next(topic.name, topic.queues)
        else:
            qid = self._choose_queue(topic.name, topic.queues, queue_id, sharding_key)
        if plain and not delay_level and not broker_properties:
            return PreparedSend(
                PendingMessage(
                    topic.name,
                    qid,
                    message.body,
                    uniq_key or self._ids.next(),
                    message.tags,
                    born_ts_ms=now_ms() if born_ts_ms is None else born_ts_ms,
                )
            )
        keys, props = _stored_properties(message, broker_properties)
        now = now_ms()
        born = now if born_ts_ms is None else born_ts_ms
        uniq = uniq_key or self._ids.next()
        deliver_at = None
        if delay_level:  # a delay level wins over a timer (RocketMQ clears the timer properties)
            props = {k: v for k, v in props.items() if k not in TIMER_PROPERTIES}
        else:
            max_delay_ms = self._store.config.timer_max_delay_sec * 1000
            try:
                deliver_at = timer_deliver_ms(
                    props, message.deliver_at_ms, now_ms=now, max_delay_ms=max_delay_ms
                )
            except InvalidMessageError as exc:
                raise InvalidMessageError(str(exc), topic=topic.name) from None
        if deliver_at is None and not delay_level:
            return PreparedSend(
                PendingMessage(topic.name, qid, bytes(message.body), uniq, message.tags, keys, props, born)
            )
        # Delayed and timer messages wait in the schedule topic; the schedule job re-puts them.
        envelope = schedule_envelope(
            topic.name, qid, props, sent_ms=now, delay_level=delay_level, deliver_at_ms=deliver_at
        )
        pending = PendingMessage(
            body=bytes(message.body),
            uniq_key=uniq,
            tags=message.tags,
            keys=keys,
            born_ts_ms=born,
            **envelope._asdict(),
        )
        return PreparedSend(pending, MessageQueue(topic.name, qid))

    def prepare_batch(
        self,
        messages: Sequence[Message],
        queue_id: int | None = None,
        *,
        uniq_keys: Sequence[str | None] | None = None,
        born_ts_ms: int | None = None,
        broker_properties: Sequence[Mapping[str, str]] | None = None,
    ) -> tuple[PreparedSend, ...]:
        """:meth:`prepare` for the messages of one batch: one topic, one queue, no delay or timer
        (RocketMQ's batch send), each message checked as :meth:`prepare` checks it, but the topic
        looked up and the queue chosen once for all (a wire batch of 32 asked them 32 times).

        Args:
            messages: the batch's messages, of one topic.
            queue_id: the queue all of them go to; None: one chosen round robin.
            uniq_keys, broker_properties: per message, as :meth:`prepare` takes them (None: none).
            born_ts_ms: when the batch was born (a wire client's ``bornTimestamp``); None: now.

        Raises:
            ProducerClosedError: the producer is closed.
            InvalidMessageError: no message, mixed topics, a delayed or timer message, or a bad one.
            InvalidTopicError, TopicNotFoundError, InvalidArgumentError: bad input.
        """
        self._check_open()
        if not messages:
            raise InvalidMessageError("a batch holds at least one message")
        n = len(messages)
        uniq = [None] * n if uniq_keys is None else list(uniq_keys)
        extra: Sequence[Mapping[str, str] | None] = (
            [None] * n if broker_properties is None else broker_properties
        )
        if len(uniq) != n or len(extra) != n:
            raise InvalidArgumentError("uniq_keys and broker_properties take one item per message")
        topic_name = _checked_batch(messages)
        for u in uniq:
            if u is not None and type(u) is not str:
                raise InvalidArgumentError(f"uniq_key {u!r} must be a string", uniq_key=u)
        qid, topic = self._batch_queue(topic_name, queue_id)
        born = now_ms() if born_ts_ms is None else born_ts_ms
        out = []
        for m, u, b in zip(messages, uniq, extra, strict=True):
            keys, props = _stored_properties(m, b)
            uniq_key = u or self._ids.next()
            pending = PendingMessage(topic, qid, bytes(m.body), uniq_key, m.tags, keys, props, born)
            out.append(PreparedSend(pending))
        return tuple(out)

    def new_uniq_key(self) -> str:
        """A new unique message id (``UNIQ_KEY``), as this producer gives a message sent without one."""
        return self._ids.next()

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
        message_group: str | None = None,
    ) -> SendResult:
        """Send one message synchronously: it is stored in one Delta commit when this returns.

        Args:
            message: what to send.
            queue_id: an explicit queue; default round robin over the topic's queues.
            sharding_key: choose the queue by a stable hash of this key (ordered messages), as
                Java's ``SelectMessageQueueByHash``.
            message_group: a FIFO message group (RocketMQ 5): every message of the group goes to
                one queue (:func:`~engine.protocol.messages.message_group_queue`, as RocketMQ 5's
                Python client chooses) and carries its group, which a ``SimpleConsumer`` of a FIFO
                group receives in order. Not with ``queue_id`` or ``sharding_key``.
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
        return self.append(
            self.prepare(
                message, queue_id, sharding_key, delay_level=delay_level, message_group=message_group
            )
        )

    def append(self, prepared: PreparedSend) -> SendResult:
        """Commit one prepared send synchronously: the second half of :meth:`send`.

        Returns:
            Where the message was stored, as :meth:`send` reports it.

        Raises:
            ProducerClosedError: the producer is closed.
            InvalidArgumentError: not a prepared send (:meth:`prepare` makes them).
            CommitConflictError, StoreError, CommitStateUnknownError: the store refused the write.
        """
        self._check_open()
        pending, destination = _checked(prepared)
        return sent_result(send_results(self._writer.append_batch([pending]))[0], destination)

    def append_batch(self, prepared: Sequence[PreparedSend]) -> list[SendResult]:
        """Commit prepared sends together: one commit per commit-log shard their queues live in
        (one commit in a store of one shard); results in input order.

        Raises:
            ProducerClosedError: the producer is closed.
            InvalidArgumentError: not a sequence of prepared sends.
            CommitConflictError, StoreError, CommitStateUnknownError: the store refused a write (in
                a store of several shards, other shards' parts may be stored).
        """
        self._check_open()
        if isinstance(prepared, (str, bytes)) or not isinstance(prepared, Sequence):
            raise InvalidArgumentError(
                f"append_batch takes a sequence of prepared sends, got {type(prepared).__name__}"
            )
        if not prepared:
            return []
        pending, destinations = zip(*(_checked(p) for p in prepared), strict=True)
        results = send_results(self._writer.append_batch(pending))
        if not any(destinations):
            return results
        return [sent_result(r, d) for r, d in zip(results, destinations, strict=True)]

    def append_async(self, prepared: PreparedSend) -> Future[SendResult]:
        """Queue a prepared send for a micro-batch, as :meth:`send_async` does.

        Raises:
            ProducerClosedError: the producer is closed.
            InvalidArgumentError: not a prepared send.
        """
        self._check_open()
        return self._enqueue(_checked(prepared))

    def append_half(self, prepared: PreparedSend, group: str) -> HalfMessage:
        """Store a prepared send as a half message of producer group ``group``: invisible to
        consumers until :meth:`end_transaction` commits it into its real queue.

        Raises:
            ProducerClosedError: the producer is closed.
            InvalidMessageError: a delayed or timer send (transactional messages are not delayed).
            InvalidArgumentError: not a prepared send, or a bad group name.
            CommitConflictError, StoreError, CommitStateUnknownError: the store refused the write.
        """
        self._check_open()
        _checked(prepared)
        group = validate_group_name(group)
        if prepared.destination is not None:
            raise InvalidMessageError(
                "transactional messages cannot be delayed or timed", topic=prepared.destination.topic
            )
        half = half_message(prepared.pending, group)
        [stamped] = half_writer(self._store, self._writer).append([half])
        return stored_half(half, stamped)

    def end_transaction(
        self, half: HalfMessage, state: LocalTransactionState, *, reason: str, check_times: int = 0
    ) -> Decision:
        """Decide a half message, exactly once: COMMIT re-puts it into its real queue, ROLLBACK
        records it (see :func:`engine.store.transactions.end_transaction`).

        Args:
            half: the half message (:meth:`append_half`, or one loaded for a check-back).
            state: COMMIT or ROLLBACK.
            reason: who decided (``local``, ``check``, ``wire``), recorded with the decision.
            check_times: the check-back round that decided, 0 for the sender's own decision.

        Returns:
            The decision that stands: this one, or (``won=False``) one another decider recorded first.

        Raises:
            InvalidArgumentError: ``state`` is not COMMIT or ROLLBACK.
            CommitConflictError, StoreError, CommitStateUnknownError: the store refused the write.
        """
        return end_transaction(self._store, self._writer, half, state, reason=reason, check_times=check_times)

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
        first_topic = _checked_batch(messages)
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
        self,
        message: Message,
        queue_id: int | None = None,
        sharding_key: str | None = None,
        *,
        message_group: str | None = None,
    ) -> Future[SendResult]:
        """Queue a message for a micro-batch; the future resolves once its commit lands.

        Messages are grouped by ``linger_ms`` and ``batch_size`` into one commit each. Validation
        errors raise here, before anything is queued; store errors resolve the future.
        ``message_group`` as :meth:`send`.
        """
        return self._enqueue(self.prepare(message, queue_id, sharding_key, message_group=message_group))

    def _enqueue(self, prepared: PreparedSend) -> Future[SendResult]:
        """Hand a checked message to the async worker; the future resolves once its commit lands."""
        future: Future[SendResult] = self._async.put((prepared,), single=True)
        return future

    def append_batch_async(self, prepared: Sequence[PreparedSend]) -> Future[list[SendResult]]:
        """Queue prepared sends to be committed together, in the async worker's next group commit:
        never split across commits (one commit per commit-log shard, as :meth:`append_batch`), but
        sharing that commit with other queued sends. The future resolves to the results in input
        order once the commit lands, or to the error of a failed commit.

        Raises:
            ProducerClosedError: the producer is closed.
            InvalidArgumentError: not a non-empty sequence of prepared sends; nothing is queued.
        """
        self._check_open()
        if isinstance(prepared, (str, bytes)) or not isinstance(prepared, Sequence) or not prepared:
            raise InvalidArgumentError("append_batch_async takes a non-empty sequence of prepared sends")
        future: Future[list[SendResult]] = self._async.put(tuple(_checked(p) for p in prepared), single=False)
        return future

    def commit_groups(self, groups: Sequence[Sequence[PreparedSend]]) -> list[list[SendResult] | MQError]:
        """Commit groups of prepared sends now, on the calling thread, as the async worker commits
        what is queued: together, one commit per commit-log shard their queues live in, a group
        never split across commits of one shard. For a caller that gathers concurrent sends itself
        (a door committing on its own event loop).

        Returns:
            For each group, in order: its results in input order, or the error that failed it
            (then it is in no commit; in a store of several shards, a group spread over shards
            fails with its first failed shard's error, and its other parts may be stored).

        Raises:
            ProducerClosedError: the producer is closed.
            InvalidArgumentError: a group that is not a non-empty sequence of prepared sends;
                nothing is committed.
        """
        self._check_open()
        checked = []
        for group in groups:
            if isinstance(group, (str, bytes)) or not isinstance(group, Sequence) or not group:
                raise InvalidArgumentError("commit_groups takes non-empty sequences of prepared sends")
            checked.append(tuple(_checked(p) for p in group))
        return self._commit_groups(checked) if checked else []

    def _commit_groups(self, groups: Sequence[Sequence[PreparedSend]]) -> list[list[SendResult] | MQError]:
        try:
            return self._committed_groups(groups)
        except MQError as exc:
            return [exc] * len(groups)
        except Exception as exc:  # surface as a store error (the async worker stays alive)
            return [StoreError(f"async send failed: {exc}", cause=exc)] * len(groups)

    def _committed_groups(self, groups: Sequence[Sequence[PreparedSend]]) -> list[list[SendResult] | MQError]:
        owner = [i for i, sends in enumerate(groups) for _ in sends]
        messages = [p.pending for sends in groups for p in sends]
        if self._writer.shards == 1:  # one commit, whose error fails the whole group
            parts = [ShardPart(0, list(range(len(messages))), self._writer.append_batch(messages), None)]
        else:
            parts = self._writer.commit_parts(messages)
        results: list[SendResult | None] = [None] * len(messages)
        failed: dict[int, MQError] = {}
        for part in parts:
            if part.error is not None:
                for i in part.positions:
                    failed.setdefault(owner[i], part.error)
                continue
            assert part.stamped is not None
            for i, result in zip(part.positions, send_results(part.stamped), strict=True):
                results[i] = result
        outcomes: list[list[SendResult] | MQError] = []
        start = 0
        for k, sends in enumerate(groups):
            end = start + len(sends)
            error = failed.get(k)
            if error is not None:
                outcomes.append(error)
            else:
                outcomes.append(
                    [
                        sent_result(r, p.destination)
                        for r, p in zip(results[start:end], sends, strict=True)
                        if r is not None
                    ]
                )
            start = end
        return outcomes

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every message given to :meth:`send_async` is committed or failed.

        Raises:
            InvalidArgumentError: ``timeout`` is not a number of seconds >= 0.
            TimeoutError: sends are still in flight after ``timeout`` seconds.
        """
        self._async.flush(timeout)

    def close(self) -> None:
        """Flush pending async sends, let the commit-log checkpoint they made due be written, and
        stop; later sends raise :class:`ProducerClosedError`."""
        if self._closed:
            return
        self.flush()
        self._closed = True
        self._async.stop()
        self._writer.close()
