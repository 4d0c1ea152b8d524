"""A QMQ consumer's pull sequences, recounted from its group's PULL rows as the pull-log job
numbers them: one per leased offset, in the consumer's action order, other consumers left out."""

from __future__ import annotations

from engine.protocol.actions import ACK, PULL
from engine.qmq.pull_sequences import pulled_offsets


def row(
    consumer: str, action: str, offset: int, end: int | None = None, deadline: int = 9
) -> dict[str, object]:
    return {
        "consumer_id": consumer,
        "action": action,
        "topic": "T",
        "queue_id": 1,
        "queue_offset": offset,
        "end_offset": end,
        "deadline_ms": deadline,
    }


def test_each_leased_offset_of_the_consumer_is_one_sequence_in_order() -> None:
    rows = [
        row("c1", PULL, 5),
        row("c2", PULL, 6),  # another consumer's
        row("c1", ACK, 5),  # not a pull
        row("c1", PULL, 7, end=9),  # a range: two offsets
        row("c1", PULL, 3, deadline=0),
    ]
    assert pulled_offsets(rows, "c1") == [("T", 1, 5, 9), ("T", 1, 7, 9), ("T", 1, 8, 9), ("T", 1, 3, 0)]
    assert pulled_offsets(rows, "nobody") == []
