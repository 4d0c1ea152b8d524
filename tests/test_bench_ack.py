"""The per-message-ack workload checks that the group delivered every stored message once."""

from __future__ import annotations

from bench.workloads.ack import delivery


def test_delivery_counts_messages_never_acked_and_acked_twice() -> None:
    stored = {(0, 0), (0, 1), (1, 0), (1, 1)}
    assert delivery(stored, [(0, 0), (0, 1), (1, 0), (1, 1)]) == {
        "delivered": 4,
        "duplicates": 0,
        "undelivered": 0,
    }
    assert delivery(stored, [(0, 0), (0, 0), (1, 1)]) == {
        "delivered": 2,
        "duplicates": 1,
        "undelivered": 2,
    }
