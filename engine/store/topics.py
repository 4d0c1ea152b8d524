"""The ``topics`` table: one row per topic configuration change, the latest row per name wins.

A row with ``queues <= 0`` marks a deletion. Rows are ordered by their stamp (``created_ts_ms``), and
a change is stamped after every earlier row of its topic, so "latest" does not depend on clocks
agreeing to the millisecond. A live topic's queue count never goes down (queue expansion only adds
queues: two racing expansions end at the larger count, never at a shrink); the configuration keeps
the creation time of the row that created the topic.

Reads are cached per table version, so a hot path that asks for a topic's configuration costs a
dictionary lookup until the table changes; :meth:`TopicCatalog.get` looks for a newer version at
most every :data:`ROUTE_REFRESH_S` seconds (RocketMQ's clients refresh routes on a timer too), so a
running producer sees an expanded topic without being restarted.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from engine.errors import InvalidTopicError, TopicNotFoundError
from engine.model import TopicConfig
from engine.store import schemas

if TYPE_CHECKING:
    from engine.store.store import Store

ROUTE_REFRESH_S = 1.0


def fold_topic_rows(rows: list[dict[str, Any]]) -> tuple[dict[str, TopicConfig], dict[str, int]]:
    """Every live topic's configuration from the table's rows, and each name's latest stamp; pure."""
    topics: dict[str, TopicConfig] = {}
    stamps: dict[str, int] = {}
    for r in sorted(rows, key=lambda r: int(r["created_ts_ms"])):
        name, queues, stamp = str(r["name"]), int(r["queues"]), int(r["created_ts_ms"])
        stamps[name] = stamp
        if queues <= 0:  # a deletion marker
            topics.pop(name, None)
            continue
        live = topics.get(name)
        created = stamp if live is None else live.created_ts_ms
        if live is not None:
            queues = max(queues, live.queues)
        topics[name] = TopicConfig(name, queues, int(r["perm"]), str(r["type"]), created)
    return topics, stamps


class TopicCatalog:
    """Every topic's latest configuration, read from (and written to) one store's ``topics`` table."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._topics: dict[str, TopicConfig] | None = None
        self._stamps: dict[str, int] = {}
        self._version = -1
        self._checked: float | None = None  # monotonic time of the last version check
        self._lock = threading.Lock()

    def configs(self, *, refresh: bool = False) -> dict[str, TopicConfig]:
        """Every topic's latest configuration; ``refresh`` checks the table for a newer version."""
        store = self._store
        version = self._version
        if refresh or self._topics is None:
            version = store.version(schemas.TOPICS)
            self._checked = time.monotonic()
        if self._topics is not None and version == self._version:
            return self._topics
        topics, stamps = fold_topic_rows(store.read(schemas.TOPICS).to_pylist())
        self._topics, self._stamps, self._version = topics, stamps, version
        return topics

    def _route_due(self) -> bool:
        return self._checked is None or time.monotonic() - self._checked >= ROUTE_REFRESH_S

    def get(self, name: str) -> TopicConfig:
        """One topic's configuration, re-reading the table once if it is not known yet.

        Raises:
            InvalidTopicError: ``name`` is not a string.
            TopicNotFoundError: no such topic.
        """
        if not isinstance(name, str):
            raise InvalidTopicError(f"topic must be a non-empty string, got {name!r}", topic=name)
        topic = self.configs(refresh=self._route_due()).get(name) or self.configs(refresh=True).get(name)
        if topic is None:
            raise TopicNotFoundError(
                f"topic {name!r} does not exist; create it with Admin.create_topic", topic=name
            )
        return topic

    def put(self, config: TopicConfig, now_ms: int) -> None:
        """Append one configuration row (a topic's creation, update or, with 0 queues, deletion).

        The row is stamped with the configuration's own creation time when it has one, else with
        ``now_ms``, moved past the latest row of the same name so that it is the latest one.
        """
        with self._lock:
            self.configs(refresh=True)
            stamp = max(config.created_ts_ms or now_ms, self._stamps.get(config.name, -1) + 1)
            row = {
                "name": config.name,
                "queues": config.queues,
                "perm": int(config.perm),
                "type": config.type,
                "created_ts_ms": stamp,
            }
            self._store.append(schemas.TOPICS, pa.Table.from_pylist([row], schema=schemas.TOPICS_SCHEMA))
            self._topics = None
