"""Finding the messages of a group's queues that are visible to it now (for ``SimpleConsumer``).

A message is visible when its queue's claim book (:class:`~engine.client.claims.QueueBook`) says it
is neither finished nor held by an unexpired claim, and it matches the subscription's tag filter.
Messages that do not match are finished in the book on the way (consumed by filtering), so later
scans skip them.
"""

from __future__ import annotations

from engine.client.claims import ClaimBook
from engine.model import MessageExt
from engine.protocol import TagFilter, parse_tag_expression, retry_topic
from engine.store.consume_queue import QueueIndex
from engine.store.store import Store

SCAN_WINDOW = 256  # queue offsets examined per step while looking for visible messages

Source = tuple[str, int, TagFilter]  # topic, queue_id, the subscription's filter


def receive_sources(store: Store, group: str, subscriptions: dict[str, TagFilter]) -> list[Source]:
    """Every (topic, queue, filter) to receive from: the subscriptions and the group's retry topic."""
    configs = store.topic_configs(refresh=True)
    subscribed = dict(subscriptions)
    retry = retry_topic(group)
    if retry in configs and retry not in subscribed:
        subscribed[retry] = parse_tag_expression("*")
    sources: list[Source] = []
    for topic, tag_filter in subscribed.items():
        config = configs.get(topic)
        if config is None:
            continue  # deleted since subscribe
        sources.extend((topic, q, tag_filter) for q in range(config.queues))
    return sources


def pick_visible(
    index: QueueIndex,
    book: ClaimBook,
    sources: list[Source],
    max_nums: int,
    now: int,
    cache: dict[int, MessageExt],
) -> list[MessageExt]:
    """Up to ``max_nums`` messages of ``sources`` visible to the group at ``now``, in source order.

    Args:
        index: the consume queues (refreshed by the caller).
        book: the group's claim state; filtered-out offsets are finished in it.
        sources: where to look, in order.
        max_nums: most messages returned.
        now: the time visibility is judged at.
        cache: messages by physical offset, read by an earlier call (filled with what this one reads).
    """
    picks: list[MessageExt] = []
    for topic, queue_id, tag_filter in sources:
        if len(picks) >= max_nums:
            break
        low, high = index.bounds(topic, queue_id)
        queue = book.queue(topic, queue_id)
        queue.raise_floor(low)
        position = queue.floor
        while position < high and len(picks) < max_nums:
            end = min(high, position + SCAN_WINDOW)
            free = [o for o in range(position, end) if queue.available(o, now)]
            position = end
            if not free:
                continue
            entries = index.entries(topic, queue_id, free[0], free[-1] + 1)
            wanted = set(free)
            offsets: list[int] = []
            physical: list[int] = []
            full = False
            for offset, code, phys in zip(
                entries["queue_offset"].to_pylist(),
                entries["tags_code"].to_pylist(),
                entries["physical_offset"].to_pylist(),
                strict=True,
            ):
                if offset not in wanted:
                    continue
                if not tag_filter.match_code(code):
                    queue.finish(offset)  # not for this subscription: consumed by filtering
                    continue
                offsets.append(offset)
                physical.append(phys)
                if len(offsets) >= max_nums - len(picks):
                    full = True
                    break
            if not offsets:
                continue
            missing = [p for p in physical if p not in cache]
            if missing:
                for row in index.messages(missing).to_pylist():
                    cache[int(row["physical_offset"])] = MessageExt.from_row(row)
            for offset, phys in zip(offsets, physical, strict=True):
                message = cache[phys]
                if not tag_filter.match_tag(message.tags):
                    queue.finish(offset)  # a tags-code collision
                    continue
                picks.append(message)
            if full:
                # Stopped before the window's end; if collisions left room, go on after the last.
                position = offsets[-1] + 1
    return picks
