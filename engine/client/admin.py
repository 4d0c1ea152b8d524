"""Administration: topics and their statistics (RocketMQ's ``MQAdmin``)."""

from __future__ import annotations

from engine.delays import MAX_DELAY_LEVEL
from engine.errors import InvalidArgumentError, InvalidTopicError, TopicExistsError
from engine.model import QueueStats, TopicConfig
from engine.protocol import MAX_QUEUES, SCHEDULE_TOPIC, is_system_topic, validate_topic_name
from engine.store.queues import QueueIndex
from engine.store.store import Store, now_ms

TOPIC_TYPES = ("NORMAL", "FIFO", "DELAY", "TRANSACTION")


class Admin:
    """Creates topics and reports on them."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._index = QueueIndex(store)

    def create_topic(
        self, name: str, queues: int | None = None, *, type: str = "NORMAL", perm: int = 6
    ) -> TopicConfig:
        """Create a topic with ``queues`` queues (default 4); idempotent for the same settings.

        Raises:
            InvalidTopicError: a bad or reserved name.
            InvalidArgumentError: queues outside 1..1024, an unknown type or permission.
            TopicExistsError: the topic exists with other settings.
        """
        validate_topic_name(name)
        if is_system_topic(name):
            raise InvalidTopicError(
                f"topic {name!r} is reserved for the system (schedule, transaction, retry, DLQ)", topic=name
            )
        return self._create(name, self._store.config.default_queues if queues is None else queues, type, perm)

    def _create(self, name: str, queues: int, type: str, perm: int) -> TopicConfig:
        if isinstance(queues, bool) or not isinstance(queues, int) or not 1 <= queues <= MAX_QUEUES:
            raise InvalidArgumentError(
                f"queues {queues!r} must be 1..{MAX_QUEUES}", topic=name, queues=queues
            )
        if type not in TOPIC_TYPES:
            raise InvalidArgumentError(f"type {type!r} must be one of {', '.join(TOPIC_TYPES)}", topic=name)
        if perm not in (2, 4, 6):
            raise InvalidArgumentError("perm must be 2 (write), 4 (read) or 6 (read and write)", topic=name)
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

    def _ensure_system_topic(self, name: str, queues: int = 1) -> TopicConfig:
        """Create a broker-owned topic (retry, DLQ, schedule) if it is missing."""
        existing = self._store.topic_configs().get(name) or self._store.topic_configs(refresh=True).get(name)
        if existing is not None:
            return existing
        return self._create(name, queues, "NORMAL", 6)

    def ensure_schedule_topic(self) -> TopicConfig:
        """The delay topic: one queue per delay level plus one for arbitrary-time timers."""
        return self._ensure_system_topic(SCHEDULE_TOPIC, MAX_DELAY_LEVEL + 1)

    def topics(self, *, include_system: bool = False) -> list[TopicConfig]:
        """Every topic, sorted by name (system topics only when asked)."""
        configs = self._store.topic_configs(refresh=True).values()
        return sorted(
            (c for c in configs if include_system or not is_system_topic(c.name)), key=lambda c: c.name
        )

    def topic_stats(self, topic: str) -> list[QueueStats]:
        """Per queue: min offset, max offset (the next to be written) and last store time.

        Counts dispatched messages: what consumers can pull.

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
