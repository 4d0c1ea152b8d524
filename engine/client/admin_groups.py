"""Consumer groups as an operator sees them: which exist, how far each is (RocketMQ's
``consumerProgress``), and which consume a topic.

A group is known from what it left in the logs: heartbeats in ``groups`` (push consumers), committed
offsets in ``consumer_offset``, actions in ``action_log`` (per-message consumers) and its
``%RETRY%`` / ``%DLQ%`` topics.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow.compute as pc

from engine.client.admin_offsets import QueueLag, lag_rows
from engine.client.membership import DEFAULT_MEMBER_TIMEOUT_MS, live_subscriptions
from engine.errors import InvalidArgumentError
from engine.protocol.names import DLQ_PREFIX, RETRY_PREFIX, validate_group_name
from engine.store import schemas
from engine.store.consume_queue import QueueIndex
from engine.store.store import Store


@dataclass(frozen=True)
class GroupSummary:
    """One consumer group: live members, the topics it consumes and how far behind it is in all.

    ``topics`` are the topics its live members subscribe plus those it committed offsets for;
    ``lag`` is the sum of :attr:`QueueLag.lag` over its committed queues.
    """

    group: str
    members: int
    topics: tuple[str, ...]
    lag: int
    has_dlq: bool


@dataclass(frozen=True)
class QueueProgress:
    """A group's progress on one queue (a row of ``mq group progress``).

    ``committed_offset`` is the next offset the group consumes (None: never committed);
    ``last_consumed_ts_ms`` is the store time of the last message before it (the newest consumed
    one, None when there is none or it was removed); ``last_commit_ts_ms`` when the offset was
    committed.
    """

    group: str
    consumer_id: str
    topic: str
    queue_id: int
    min_offset: int
    max_offset: int
    committed_offset: int | None
    lag: int
    last_consumed_ts_ms: int | None
    last_commit_ts_ms: int | None


def _distinct_groups(store: Store, table: str) -> set[str]:
    column = store.read(table, columns=["group"])["group"]
    return {str(g) for g in pc.unique(column).to_pylist()}


def group_names(store: Store) -> list[str]:
    """Every group the logs know of, sorted."""
    names = set(live_subscriptions(store))
    names |= _distinct_groups(store, schemas.CONSUMER_OFFSET)
    names |= _distinct_groups(store, schemas.ACTION_LOG)
    for topic in store.topic_configs(refresh=True):
        for prefix in (RETRY_PREFIX, DLQ_PREFIX):
            if topic.startswith(prefix):
                names.add(topic[len(prefix) :])
    return sorted(names)


def list_groups(store: Store) -> list[GroupSummary]:
    """Every known group with its live members, topics, total lag and whether it has a DLQ."""
    subscriptions = live_subscriptions(store)
    lags = lag_rows(store)
    topics = set(store.topic_configs(refresh=True))
    out = []
    for group in group_names(store):
        members = subscriptions.get(group, {})
        mine = [r for r in lags if r.group == group]
        consumed = {t for subs in members.values() for t in subs} | {r.topic for r in mine}
        consumed = {t for t in consumed if not t.startswith(RETRY_PREFIX)}
        out.append(
            GroupSummary(
                group,
                len(members),
                tuple(sorted(consumed)),
                sum(r.lag for r in mine),
                f"{DLQ_PREFIX}{group}" in topics,
            )
        )
    return out


def group_progress(store: Store, group: str, topic: str | None = None) -> list[QueueProgress]:
    """Per queue of every topic ``group`` committed offsets for (only ``topic`` when given).

    Raises:
        InvalidArgumentError: a bad group name.
        TopicNotFoundError: ``topic`` is given and does not exist.
    """
    validate_group_name(group)
    if topic is not None:
        store.topic(topic)
    rows: list[QueueLag] = [r for r in lag_rows(store, group) if topic is None or r.topic == topic]
    index = QueueIndex(store)
    index.refresh()
    out = []
    for r in rows:
        low, _ = index.bounds(r.topic, r.queue_id)
        last_ts = None
        if r.committed_offset is not None and r.committed_offset - 1 >= low:
            entry = index.entries(r.topic, r.queue_id, r.committed_offset - 1, r.committed_offset)
            if entry.num_rows:
                last_ts = int(entry["store_ts_ms"][0].as_py())
        out.append(
            QueueProgress(
                r.group,
                r.consumer_id,
                r.topic,
                r.queue_id,
                low,
                r.max_offset,
                r.committed_offset,
                r.lag,
                last_ts,
                r.last_commit_ts_ms,
            )
        )
    return out


def consuming_groups(store: Store, topic: str, timeout_ms: int = DEFAULT_MEMBER_TIMEOUT_MS) -> list[str]:
    """Groups that still consume ``topic``: a live member subscribes to it, or the group committed
    offsets for it and has messages left to consume. Sorted.

    Raises:
        InvalidArgumentError: a bad timeout.
    """
    if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int) or timeout_ms <= 0:
        raise InvalidArgumentError(f"timeout_ms {timeout_ms!r} must be an int > 0", timeout_ms=timeout_ms)
    groups = {
        group
        for group, members in live_subscriptions(store, timeout_ms).items()
        if any(topic in subs for subs in members.values())
    }
    groups |= {r.group for r in lag_rows(store) if r.topic == topic and r.lag > 0}
    return sorted(groups)
