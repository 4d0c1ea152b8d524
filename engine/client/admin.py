"""Administration: topics and their statistics (RocketMQ's ``MQAdmin``)."""

from __future__ import annotations

from collections.abc import Sequence

from engine.client import admin_offsets
from engine.client.admin_groups import (
    GroupSummary,
    QueueProgress,
    consuming_groups,
    group_progress,
    list_groups,
)
from engine.client.admin_offsets import QueueLag
from engine.client.producer import Producer
from engine.client.queries import (
    KeyQueryResult,
    find_message,
    query_by_key,
    query_by_time,
    query_by_uniq_key,
    view_message,
)
from engine.client.trace import MessageTrace, trace_message
from engine.errors import (
    InvalidArgumentError,
    InvalidTopicError,
    StoreError,
    TopicExistsError,
    TopicInUseError,
    TopicShrinkError,
)
from engine.model import Message, MessageExt, QueueStats, SendResult, TopicConfig
from engine.protocol.message_ids import parse_msg_id
from engine.protocol.names import (
    PROPERTY_RETRY_TOPIC,
    RESEND_PROPERTIES,
    RESERVED_PROPERTIES,
    SCHEDULE_TOPIC,
    dlq_topic,
    is_system_topic,
    validate_group_name,
    validate_topic_name,
)
from engine.protocol.permissions import DEFAULT_PERM
from engine.protocol.schedule import SCHEDULE_PROPERTIES
from engine.protocol.topics import system_topic_queues, validate_topic_settings
from engine.store.consume_queue import QueueIndex
from engine.store.group_configs import GroupConfig, group_config, record_group_config
from engine.store.store import Store, now_ms


def _check_user_topic(name: str) -> None:
    validate_topic_name(name)
    if is_system_topic(name):
        raise InvalidTopicError(
            f"topic {name!r} is reserved for the system (schedule, transaction, retry, DLQ)", topic=name
        )


class Admin:
    """Creates topics and reports on them."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._index = QueueIndex(store)
        self._producer: Producer | None = None

    def create_topic(
        self, name: str, queues: int | None = None, *, type: str = "NORMAL", perm: int = DEFAULT_PERM
    ) -> TopicConfig:
        """Create a topic with ``queues`` queues (default 4); idempotent for the same settings.

        Raises:
            InvalidTopicError: a bad or reserved name.
            InvalidArgumentError: queues outside 1..1024, an unknown type or permission.
            TopicExistsError: the topic exists with other settings.
        """
        _check_user_topic(name)
        return self._create(name, self._store.config.default_queues if queues is None else queues, type, perm)

    def create_topics(
        self,
        names: Sequence[str],
        queues: int | None = None,
        *,
        type: str = "NORMAL",
        perm: int = DEFAULT_PERM,
    ) -> list[TopicConfig]:
        """Create many topics with the same settings in one commit; idempotent per topic.

        Topics that already exist with these settings are left as they are; nothing is written when
        any name is bad or exists with other settings.

        Returns:
            Every named topic's configuration, in the order given.

        Raises:
            InvalidArgumentError: ``names`` is not a list of names, or names one topic twice; queues
                outside 1..1024, an unknown type or permission.
            InvalidTopicError: a bad or reserved name.
            TopicExistsError: a topic exists with other settings.
        """
        if isinstance(names, str) or not isinstance(names, Sequence):
            raise InvalidArgumentError(f"names must be a list of topic names, got {names!r}", names=names)
        if len(set(names)) != len(names):
            raise InvalidArgumentError("names must not name a topic twice", names=list(names))
        count = self._store.config.default_queues if queues is None else queues
        for name in names:
            validate_topic_name(name)
            if is_system_topic(name):
                raise InvalidTopicError(
                    f"topic {name!r} is reserved for the system (schedule, transaction, retry, DLQ)",
                    topic=name,
                )
            validate_topic_settings(name, count, type, perm)
        existing = self._store.topic_configs(refresh=True)
        created_ts = now_ms()
        out: list[TopicConfig] = []
        new: list[TopicConfig] = []
        for name in names:
            known = existing.get(name)
            if known is None:
                config = TopicConfig(name, count, perm, type, created_ts)
                new.append(config)
                out.append(config)
            elif (known.queues, known.type, known.perm) == (count, type, perm):
                out.append(known)
            else:
                raise TopicExistsError(
                    f"topic {name!r} exists with queues={known.queues}, type={known.type}, perm={known.perm}",
                    topic=name,
                )
        self._store.put_topics(new)
        return out

    def _create(self, name: str, queues: int, type: str, perm: int) -> TopicConfig:
        validate_topic_settings(name, queues, type, perm)
        existing = self._store.topic_configs(refresh=True).get(name)
        if existing is not None:
            if (existing.queues, existing.type, existing.perm) == (queues, type, perm):
                return existing
            raise TopicExistsError(
                f"topic {name!r} exists with queues={existing.queues}, type={existing.type}, "
                f"perm={existing.perm}",
                topic=name,
            )
        config = TopicConfig(name, queues, perm, type, now_ms())
        self._store.put_topic(config)
        return config

    def ensure_system_topic(self, name: str) -> TopicConfig:
        """Create a broker-owned topic (retry, DLQ, schedule) if it is missing, with the queues the
        broker gives it; idempotent.

        Args:
            name: a system topic's name (``%RETRY%<group>``, ``%DLQ%<group>``, ``SCHEDULE_TOPIC_XXXX`` ...).

        Returns:
            The topic's configuration.

        Raises:
            InvalidTopicError: a bad name, or one that is not a system topic.
        """
        validate_topic_name(name)
        if not is_system_topic(name):
            raise InvalidTopicError(
                f"topic {name!r} is not a system topic; create it with create_topic", topic=name
            )
        existing = self._store.topic_configs().get(name) or self._store.topic_configs(refresh=True).get(name)
        if existing is not None:
            return existing
        return self._create(name, system_topic_queues(name), "NORMAL", DEFAULT_PERM)

    def ensure_schedule_topic(self) -> TopicConfig:
        """The delay topic: one queue per delay level plus one for arbitrary-time timers."""
        return self.ensure_system_topic(SCHEDULE_TOPIC)

    def topics(self, *, include_system: bool = False) -> list[TopicConfig]:
        """Every topic, sorted by name (system topics only when asked)."""
        configs = self._store.topic_configs(refresh=True).values()
        return sorted(
            (c for c in configs if include_system or not is_system_topic(c.name)), key=lambda c: c.name
        )

    def update_topic(self, name: str, *, queues: int | None = None, perm: int | None = None) -> TopicConfig:
        """Grow a topic to ``queues`` queues and/or change its permission, while it is in use.

        Existing queues keep their messages and offsets; new queues start at offset 0. Producers
        see the new queues at their next route refresh (about a second), push consumers at their
        next rebalance; no message is lost or delivered twice by the change. Asking for the
        current settings writes nothing.

        Returns:
            The topic's configuration after the update.

        Raises:
            InvalidTopicError: a bad name or a system topic.
            TopicNotFoundError: no such topic.
            TopicShrinkError: fewer queues than the topic has (queues are only ever added).
            InvalidArgumentError: queues above 1024 or an unknown permission.
        """
        validate_topic_name(name)
        if is_system_topic(name):
            raise InvalidTopicError(f"topic {name!r} belongs to the system; it is not updated", topic=name)
        current = self._store.topic_configs(refresh=True).get(name) or self._store.topic(name)
        wanted_queues = current.queues if queues is None else queues
        wanted_perm = current.perm if perm is None else perm
        if (
            not isinstance(wanted_queues, bool)
            and isinstance(wanted_queues, int)
            and wanted_queues < current.queues
        ):
            raise TopicShrinkError(
                f"topic {name!r} has {current.queues} queues; it cannot shrink to {wanted_queues} "
                "(queues are only added: their messages and offsets would be stranded)",
                topic=name,
                queues=current.queues,
                requested=wanted_queues,
            )
        validate_topic_settings(name, wanted_queues, current.type, wanted_perm)
        if (wanted_queues, wanted_perm) == (current.queues, current.perm):
            return current
        self._store.put_topic(TopicConfig(name, wanted_queues, wanted_perm, current.type))
        return self._store.topic_configs(refresh=True)[name]

    def delete_topic(self, name: str, *, force: bool = False) -> TopicConfig:
        """Remove a topic from routing: producers and consumers no longer find it. Its rows stay in
        the logs until retention removes them.

        Args:
            name: the topic.
            force: delete even while groups consume it.

        Returns:
            The configuration the topic had.

        Raises:
            InvalidTopicError: a bad name or a system topic.
            TopicNotFoundError: no such topic.
            TopicInUseError: groups still consume it (a live subscriber, or unconsumed messages of a
                group that committed offsets) and ``force`` is not set; nothing is written.
        """
        validate_topic_name(name)
        if is_system_topic(name):
            raise InvalidTopicError(f"topic {name!r} belongs to the system; it is not deleted", topic=name)
        current = self._store.topic_configs(refresh=True).get(name) or self._store.topic(name)
        if not force:
            groups = consuming_groups(self._store, name)
            if groups:
                raise TopicInUseError(
                    f"topic {name!r} is still consumed by group(s) {', '.join(groups)}; "
                    "stop them first or delete with force",
                    topic=name,
                    groups=groups,
                )
        self._store.put_topic(TopicConfig(name, 0, current.perm, current.type))
        return current

    def topic_stats(self, topic: str) -> list[QueueStats]:
        """Per queue: min offset, max offset (the next to be written) and last store time.

        Counts what consumers can pull: the messages stored, dispatched or not yet.

        Raises:
            TopicNotFoundError: no such topic.
        """
        config = self._store.topic(topic)
        self._index.refresh()
        stats = []
        for qid in range(config.queues):
            lo, hi = self._index.bounds(topic, qid)
            last_ts = None
            if hi > lo:
                last = self._index.entries(topic, qid, hi - 1, hi)
                if last.num_rows:
                    last_ts = int(last["store_ts_ms"][0].as_py())
            stats.append(QueueStats(topic, qid, lo, hi, last_ts))
        return stats

    def message_counts(self) -> dict[str, int]:
        """Per topic (system topics left out), its pullable and retained messages: one look at the
        consume queue's bounds, however many topics there are (what :meth:`topic_stats` counts,
        without reading any entry)."""
        self._index.refresh()
        marks = self._index.marks()
        return {
            t.name: sum(marks.max_offset(t.name, q) - marks.min_offset(t.name, q) for q in range(t.queues))
            for t in self.topics()
        }

    # ----------------------------------------------------------------- finding messages
    def view_message(self, msg_id: str, topic: str | None = None) -> MessageExt:
        """The stored message with id ``msg_id``: an offset msg id (one point read of the commit
        log) or a client unique id (an ``index`` look-up, in ``topic`` when given); see
        :func:`engine.client.queries.view_message`.

        Raises:
            InvalidArgumentError: a malformed id, or an offset id issued by another store.
            MessageNotFoundError: no such message (never written, or expired).
        """
        return view_message(self._store, msg_id, topic=topic, index=self._index)

    def find_message(self, msg_id: str) -> MessageExt:
        """The message with offset msg id or uniq key ``msg_id``, in any topic (``mq message view``).

        Raises:
            InvalidArgumentError: an empty id or one with whitespace.
            MessageNotFoundError: no stored message has that id.
        """
        return find_message(self._store, msg_id, index=self._index)

    def query_by_key(
        self, topic: str, key: str, begin_ms: int, end_ms: int, max_num: int = 32
    ) -> KeyQueryResult:
        """Messages of ``topic`` with key ``key`` stored in ``[begin_ms, end_ms]``: at most ``max_num``,
        the most recent, in store order. Reads the ``index`` table (built by the index job) pruned
        by file statistics and the commit-log versions the index has not reached, then the commit
        log by offset; see :mod:`engine.client.queries`. The result is a list; its ``complete`` is
        False when the index was too far behind to see every message.

        Raises:
            TopicNotFoundError: no such topic.
            InvalidArgumentError: a bad key, time range or ``max_num``.
        """
        return query_by_key(self._store, topic, key, begin_ms, end_ms, max_num, index=self._index)

    def query_by_time(self, topic: str, begin_ms: int, end_ms: int, max_num: int = 32) -> list[MessageExt]:
        """Dispatched messages of ``topic`` stored in ``[begin_ms, end_ms)``: the oldest ``max_num``,
        in store order; see :func:`engine.client.queries.query_by_time`.

        Raises:
            TopicNotFoundError: no such topic.
            InvalidArgumentError: a bad time range or ``max_num``.
        """
        return query_by_time(self._store, topic, begin_ms, end_ms, max_num, index=self._index)

    def query_by_uniq_key(self, topic: str, uniq_key: str) -> MessageExt | None:
        """The message of ``topic`` with client unique id ``uniq_key`` (or offset msg id), or None if
        no message has it (indexed yet or not).

        Raises:
            TopicNotFoundError: no such topic.
            InvalidArgumentError: a bad uniq key.
        """
        return query_by_uniq_key(self._store, topic, uniq_key, index=self._index)

    # ----------------------------------------------------------------- dead letters
    def dlq_messages(
        self, group: str, max_num: int = 100, *, start_offset: int | None = None
    ) -> list[MessageExt]:
        """Messages of ``%DLQ%<group>`` (dispatched ones), oldest first.

        Each carries its history: ``ORIGIN_MESSAGE_ID`` (the first failed copy), ``RETRY_TOPIC``
        (the original topic) and ``RECONSUME_TIME``.

        Args:
            group: the consumer group.
            max_num: most messages returned (1..1024).
            start_offset: first DLQ queue offset to read (default: the oldest retained).

        Returns:
            The messages; an empty list when the group never dead-lettered anything.

        Raises:
            InvalidArgumentError: a bad group name, ``max_num`` or ``start_offset``.
        """
        validate_group_name(group)
        if isinstance(max_num, bool) or not isinstance(max_num, int) or not 1 <= max_num <= 1024:
            raise InvalidArgumentError(f"max_num {max_num!r} must be 1..1024", max_num=max_num)
        if start_offset is not None and (
            isinstance(start_offset, bool) or not isinstance(start_offset, int) or start_offset < 0
        ):
            raise InvalidArgumentError(
                f"start_offset {start_offset!r} must be an int >= 0", start_offset=start_offset
            )
        topic = dlq_topic(group)
        if self._store.topic_configs(refresh=True).get(topic) is None:
            return []
        self._index.refresh()
        low, high = self._index.bounds(topic, 0)
        start = low if start_offset is None else max(low, start_offset)
        end = min(high, start + max_num)
        if end <= start:
            return []
        entries = self._index.entries(topic, 0, start, end)
        rows = self._index.messages([int(p) for p in entries["physical_offset"].to_pylist()])
        return [MessageExt.from_row(r) for r in rows.to_pylist()]

    def _find_dlq(self, group: str, msg_id: str) -> MessageExt:
        topic = dlq_topic(group)
        if self._store.topic_configs(refresh=True).get(topic) is None:
            raise InvalidArgumentError(
                f"group {group!r} has no dead-letter queue; no message {msg_id!r} to resend",
                group=group,
                msg_id=msg_id,
            )
        self._index.refresh()
        try:  # an offset msg id points straight at its commit-log row
            store_id, physical = parse_msg_id(msg_id)
        except InvalidArgumentError:
            store_id, physical = "", -1
        if store_id == self._store.store_id:
            try:
                row = self._index.messages([physical]).to_pylist()[0]
            except StoreError:
                row = None
            if row is not None and row["topic"] == topic and row["msg_id"] == msg_id.upper():
                return MessageExt.from_row(row)
        low, high = self._index.bounds(topic, 0)  # else: a uniq key (the id consumers see)
        for start in range(low, high, 1024):
            entries = self._index.entries(topic, 0, start, min(high, start + 1024))
            rows = self._index.messages([int(p) for p in entries["physical_offset"].to_pylist()])
            for row in rows.to_pylist():
                if row["uniq_key"] == msg_id or row["msg_id"] == msg_id:
                    return MessageExt.from_row(row)
        raise InvalidArgumentError(
            f"message {msg_id!r} is not in the dead-letter queue of group {group!r} ({topic})",
            group=group,
            msg_id=msg_id,
        )

    def resend_dlq(self, group: str, msg_id: str) -> SendResult:
        """Send a dead-lettered message back to its original topic as a new message.

        The copy keeps the message's id (:attr:`MessageExt.msg_id`, the unique id its producer got),
        body, tags, keys, user properties and ``ORIGIN_MESSAGE_ID``; it starts again with
        ``reconsume_times`` 0. The DLQ keeps its copy (the log is append-only), so resending
        twice sends twice.

        Args:
            group: the consumer group whose DLQ holds the message.
            msg_id: the DLQ message's id (:attr:`MessageExt.msg_id`) or its offset msg id.

        Returns:
            Where the new message was stored.

        Raises:
            InvalidArgumentError: a bad group, or ``msg_id`` is not in that DLQ (nothing is sent).
            TopicNotFoundError: the original topic no longer exists.
        """
        validate_group_name(group)
        if not isinstance(msg_id, str) or not msg_id:
            raise InvalidArgumentError("msg_id must be a non-empty string", msg_id=msg_id)
        message = self._find_dlq(group, msg_id)
        original = message.properties.get(PROPERTY_RETRY_TOPIC)
        if not original:
            raise InvalidArgumentError(
                f"DLQ message {msg_id!r} does not record its original topic ({PROPERTY_RETRY_TOPIC})",
                group=group,
                msg_id=msg_id,
            )
        # System properties stay behind (KEYS comes back from the keys), but for the lineage.
        properties = {
            k: v
            for k, v in message.properties.items()
            if k not in SCHEDULE_PROPERTIES and (k not in RESERVED_PROPERTIES or k in RESEND_PROPERTIES)
        }
        copy = Message(original, message.body, message.tags, message.keys, properties)
        if self._producer is None:
            self._producer = Producer(self._store, "DLQ_RESEND")
        return self._producer.append(self._producer.prepare(copy, uniq_key=message.msg_id, resend=True))

    # ----------------------------------------------------------------- consumer offsets
    def reset_offset_by_time(self, group: str, topic: str, timestamp_ms: int) -> dict[int, int]:
        """Move a clustering group to the first message stored at or after ``timestamp_ms``, per queue.

        Found by binary search over the consume queue (file statistics, then within a file), not a
        scan. Before every message: the min offset; after all of them: the max offset. The offsets
        are committed for the group (newest commit wins) and the reset is recorded for the group's
        running PushConsumers, which drop what they hold of those queues and resume from the new
        offsets within about a second (their next commit keeps the reset); consumers started later
        read the offsets (an ``mq`` stream on a fresh start).

        Returns:
            Queue id -> the group's new offset.

        Raises:
            TopicNotFoundError: no such topic.
            InvalidArgumentError: a bad group or a negative time.
        """
        return admin_offsets.reset_offset_by_time(self._store, group, topic, timestamp_ms)

    def reset_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Set a clustering group's offset of one queue (the next offset it consumes); running
        PushConsumers of the group pick it up as after :meth:`reset_offset_by_time`.

        Raises:
            TopicNotFoundError: no such topic.
            InvalidArgumentError: a bad group or queue id.
            OffsetOutOfRangeError: ``offset`` outside ``[min offset, max offset]`` of the queue.
        """
        admin_offsets.reset_offset(self._store, group, topic, queue_id, offset)

    def groups(self) -> list[GroupSummary]:
        """Every consumer group the logs know of (RocketMQ's ``consumerConnection`` overview)."""
        return list_groups(self._store)

    def group_config(self, group: str) -> GroupConfig:
        """A consumer group's settings (the defaults for a group never configured).

        Raises:
            InvalidArgumentError: a bad group name.
        """
        return group_config(self._store, validate_group_name(group))

    def update_group(self, group: str, *, fifo: bool) -> GroupConfig:
        """Set a consumer group's settings: ``fifo`` makes it a FIFO group (RocketMQ's
        ``consumeMessageOrderly``, RocketMQ 5's FIFO consume type): its ``SimpleConsumer`` receives
        each queue in order, the next messages only after the previous are acked or dead-lettered.
        Consumers started after this take it.

        Raises:
            InvalidArgumentError: a bad group name or setting.
        """
        return record_group_config(self._store, group, fifo=fifo)

    def group_progress(self, group: str, topic: str | None = None) -> list[QueueProgress]:
        """Per queue: min/max offset, committed offset, lag and the store time of the last consumed
        message (RocketMQ's ``consumerProgress``); only ``topic`` when given.

        Raises:
            InvalidArgumentError: a bad group name.
            TopicNotFoundError: ``topic`` does not exist.
        """
        return group_progress(self._store, group, topic)

    def trace(self, msg_id: str) -> MessageTrace:
        """The life of one message read from the logs: stored, dispatched, indexed, delivered to
        which groups and consumers, acked, retried, dead-lettered, resent; see :mod:`engine.client.trace`.

        Args:
            msg_id: an offset message id or a client unique id (uniq key).

        Raises:
            InvalidArgumentError: an empty id or one with whitespace.
            MessageNotFoundError: no stored message has that id.
        """
        return trace_message(self._store, msg_id, index=self._index)

    def consumer_lag(self, group: str | None = None) -> list[QueueLag]:
        """Per group, topic and queue: max offset, committed offset, lag and the age of the oldest
        unconsumed message (what ``mq lag`` prints and the ``lag`` SQL view shows)."""
        return admin_offsets.lag_rows(self._store, group)
