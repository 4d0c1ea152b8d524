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
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from engine.errors import InvalidTopicError, StoreError, TopicNotFoundError
from engine.model import TopicConfig
from engine.store import schemas
from engine.store.delta import VERSION_COLUMN

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
    """Every topic's latest configuration, read from (and written to) one store's ``topics`` table.

    Kept up to date incrementally: a newer table version is read commit by commit (only the rows it
    added) and only the names it touched are folded again, so looking up or creating a topic costs
    the same with 10,000 topics as with one. The whole table is read once, and again only when the
    commits since the cached version are gone from the log.
    """

    def __init__(self, store: Store) -> None:
        self._store = store
        self._topics: dict[str, TopicConfig] | None = None
        self._rows: dict[str, list[dict[str, Any]]] = {}
        self._stamps: dict[str, int] = {}
        self._version = -1
        self._checked: float | None = None  # monotonic time of the last version check
        self._stale = False  # a row was written: look for the new version at the next call
        self._lock = threading.Lock()

    def configs(self, *, refresh: bool = False) -> dict[str, TopicConfig]:
        """Every topic's latest configuration; ``refresh`` checks the table for a newer version.

        The dictionary returned is never changed afterwards (a newer version makes a new one), so
        without ``refresh`` the one held is returned without the lock: a look-up never waits for
        another thread's commit of a topic (the lock is held through it, seconds on a slow store,
        and a door's event loop looks topics up).
        """
        topics = self._topics
        if topics is not None and not refresh and not self._stale:
            return topics
        with self._lock:
            return self._configs(refresh)

    def _configs(self, refresh: bool) -> dict[str, TopicConfig]:
        store = self._store
        version = self._version
        if refresh or self._topics is None or self._stale:
            version = store.version(schemas.TOPICS)
            self._checked = time.monotonic()
            self._stale = False
        if self._topics is not None and version == self._version:
            return self._topics
        if self._topics is not None and version > self._version:
            try:
                added = [
                    rows.drop_columns([VERSION_COLUMN]).to_pylist()
                    for rows, _ in store.versions_after(schemas.TOPICS, self._version, schemas.TOPICS_SCHEMA)
                ]
            except StoreError:
                pass  # the commits since our version were cleaned up: read the whole table
            else:
                self._fold_in([row for chunk in added for row in chunk], version)
                return self._topics
        # Rows of a version newer than ``version`` may be read too: reading them again later only
        # folds a row twice, which changes nothing.
        rows = store.read(schemas.TOPICS).to_pylist()
        self._rows = {}
        for row in rows:
            self._rows.setdefault(str(row["name"]), []).append(row)
        self._topics, self._stamps = fold_topic_rows(rows)
        self._version = version
        return self._topics

    def _fold_in(self, rows: list[dict[str, Any]], version: int) -> None:
        """Fold new ``rows`` (of versions up to ``version``) into the cache, name by name."""
        assert self._topics is not None
        topics = dict(self._topics)
        touched = {str(r["name"]) for r in rows}
        for row in rows:
            self._rows.setdefault(str(row["name"]), []).append(row)
        for name in touched:
            folded, stamps = fold_topic_rows(self._rows[name])
            self._stamps[name] = stamps[name]
            if name in folded:
                topics[name] = folded[name]
            else:
                topics.pop(name, None)
        self._topics, self._version = topics, version

    def _routed(self) -> dict[str, TopicConfig]:
        """The configurations, checked for a newer version when :data:`ROUTE_REFRESH_S` has passed
        since the last check, unless another thread holds the lock: its commit of a topic (or its
        refresh) lasts seconds on a slow store, and the timed check is no reason to wait for it (the
        next look-up checks again). An unknown name still waits (:meth:`get`)."""
        topics = self._topics
        due = self._checked is None or time.monotonic() - self._checked >= ROUTE_REFRESH_S
        if topics is None or self._stale or not due:
            return self.configs()
        if not self._lock.acquire(blocking=False):
            return topics
        try:
            return self._configs(True)
        finally:
            self._lock.release()

    def get(self, name: str) -> TopicConfig:
        """One topic's configuration, re-reading the table once if it is not known yet.

        Raises:
            InvalidTopicError: ``name`` is not a string.
            TopicNotFoundError: no such topic.
        """
        if not isinstance(name, str):
            raise InvalidTopicError(f"topic must be a non-empty string, got {name!r}", topic=name)
        topic = self._routed().get(name) or self.configs(refresh=True).get(name)
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
        self.put_many([config], now_ms)

    def put_many(self, configs: Sequence[TopicConfig], now_ms: int) -> None:
        """Append one row per configuration, all in one commit (see :meth:`put`)."""
        if not configs:
            return
        with self._lock:
            self._configs(True)
            rows = []
            for config in configs:
                stamp = max(config.created_ts_ms or now_ms, self._stamps.get(config.name, -1) + 1)
                rows.append(
                    {
                        "name": config.name,
                        "queues": config.queues,
                        "perm": int(config.perm),
                        "type": config.type,
                        "created_ts_ms": stamp,
                    }
                )
            version = self._store.append(
                schemas.TOPICS, pa.Table.from_pylist(rows, schema=schemas.TOPICS_SCHEMA)
            )
            if version == self._version + 1:  # nothing landed between our read and our commit
                self._fold_in(rows, version)
            else:
                self._stale = True  # the next look-up reads our commit (and any other since)
