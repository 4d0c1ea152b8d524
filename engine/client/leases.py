"""Reading what a ``SimpleConsumer`` leases: its sources, the entries of a range, their messages.

Pure reads of the consume queue and commit log; the decisions (what to lease, when) are
:mod:`engine.client.simple`'s, the commits :mod:`engine.client.claim_log`'s.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.model import MessageExt
from engine.protocol import retry_topic
from engine.protocol.selectors import MessageSelector
from engine.store.consume_queue import QueueIndex
from engine.store.store import Store

Source = tuple[str, int, MessageSelector]  # topic, queue_id, the subscription's selector
MATCH_ALL = MessageSelector.by_tag("*")


def receive_sources(store: Store, group: str, subscriptions: dict[str, MessageSelector]) -> list[Source]:
    """Every (topic, queue, filter) to receive from: the subscriptions and the group's retry topic."""
    configs = store.topic_configs(refresh=True)
    subscribed = dict(subscriptions)
    retry = retry_topic(group)
    if retry in configs and retry not in subscribed:
        subscribed[retry] = MATCH_ALL
    sources: list[Source] = []
    for topic, tag_filter in subscribed.items():
        config = configs.get(topic)
        if config is None:
            continue  # deleted since subscribe
        sources.extend((topic, q, tag_filter) for q in range(config.queues))
    return sources


@dataclass(frozen=True)
class Entries:
    """The consume-queue entries of some offsets of one queue, split by a subscription's selector."""

    offsets: list[int]  # passing the selector's tags-code stage, ascending
    physical: list[int]  # their commit-log positions
    filtered: list[int]  # not for this subscription: consumed by filtering


def read_entries(
    index: QueueIndex, topic: str, queue_id: int, offsets: list[int], selector: MessageSelector
) -> Entries:
    """The entries of ``offsets`` (ascending) of a queue, by the tags-code stage of ``selector``.

    Offsets with no entry (removed by retention meanwhile) are in none of the lists.
    """
    if not offsets:
        return Entries([], [], [])
    table = index.entries(topic, queue_id, offsets[0], offsets[-1] + 1)
    wanted = set(offsets)
    passed = selector.match_codes(table["tags_code"]).to_pylist()
    kept: list[int] = []
    physical: list[int] = []
    filtered: list[int] = []
    for offset, ok, phys in zip(
        table["queue_offset"].to_pylist(), passed, table["physical_offset"].to_pylist(), strict=True
    ):
        if offset not in wanted:
            continue
        if ok:
            kept.append(offset)
            physical.append(phys)
        else:
            filtered.append(offset)
    return Entries(kept, physical, filtered)


def read_messages(
    index: QueueIndex, physical: list[int], selector: MessageSelector = MATCH_ALL
) -> dict[int, MessageExt | None]:
    """The messages at ``physical`` commit-log positions, by position (missing ones left out);
    a message the selector does not match (its tags or properties, vectorised) maps to None."""
    if not physical:
        return {}
    rows = index.messages(physical)
    keep = [True] * rows.num_rows if selector.matches_all else selector.matches(rows).to_pylist()
    return {
        int(row["physical_offset"]): MessageExt.from_row(row) if ok else None
        for row, ok in zip(rows.to_pylist(), keep, strict=True)
    }
