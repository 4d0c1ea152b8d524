"""The ``topics`` table: one row per topic configuration change, the latest row per name wins.

A row with ``queues <= 0`` marks a deletion. Reads are cached per table version, so a hot path that
asks for a topic's configuration costs a dictionary lookup until the table changes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa

from engine.errors import InvalidTopicError, TopicNotFoundError
from engine.model import TopicConfig
from engine.store import schemas

if TYPE_CHECKING:
    from engine.store.store import Store


class TopicCatalog:
    """Every topic's latest configuration, read from (and written to) one store's ``topics`` table."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._topics: dict[str, TopicConfig] | None = None
        self._version = -1

    def configs(self, *, refresh: bool = False) -> dict[str, TopicConfig]:
        """Every topic's latest configuration; ``refresh`` checks the table for a newer version."""
        store = self._store
        version = store.version(schemas.TOPICS) if (refresh or self._topics is None) else self._version
        if self._topics is not None and version == self._version:
            return self._topics
        rows = store.read(schemas.TOPICS).to_pylist()
        rows.sort(key=lambda r: r["created_ts_ms"])
        topics: dict[str, TopicConfig] = {}
        for r in rows:
            if r["queues"] <= 0:  # a deletion marker
                topics.pop(r["name"], None)
                continue
            topics[r["name"]] = TopicConfig(r["name"], r["queues"], r["perm"], r["type"], r["created_ts_ms"])
        self._topics, self._version = topics, version
        return topics

    def get(self, name: str) -> TopicConfig:
        """One topic's configuration, re-reading the table once if it is not known yet.

        Raises:
            InvalidTopicError: ``name`` is not a string.
            TopicNotFoundError: no such topic.
        """
        if not isinstance(name, str):
            raise InvalidTopicError(f"topic must be a non-empty string, got {name!r}", topic=name)
        topic = self.configs().get(name) or self.configs(refresh=True).get(name)
        if topic is None:
            raise TopicNotFoundError(
                f"topic {name!r} does not exist; create it with Admin.create_topic", topic=name
            )
        return topic

    def put(self, config: TopicConfig, now_ms: int) -> None:
        """Append one configuration row (a topic's creation, update or, with 0 queues, deletion),
        stamped ``now_ms`` unless the configuration has its own creation time."""
        row = {
            "name": config.name,
            "queues": config.queues,
            "perm": int(config.perm),
            "type": config.type,
            "created_ts_ms": config.created_ts_ms or now_ms,
        }
        self._store.append(schemas.TOPICS, pa.Table.from_pylist([row], schema=schemas.TOPICS_SCHEMA))
        self._topics = None
