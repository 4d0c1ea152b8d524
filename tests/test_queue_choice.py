"""Which queue a send that names none goes to (engine.protocol.queue_choice): round robin from queue 0
with one commit-log shard; with several, stints of round robin over one shard's queues, left early
after a lost race."""

from __future__ import annotations

from collections import Counter

import pytest

from engine.protocol.queue_choice import STINT_ROUNDS, QueueChooser
from engine.protocol.shards import shard_of_queue

TOPIC = "Orders"


def _chooser(shards: int, lost: dict[int, int] | None = None) -> QueueChooser:
    races = lost if lost is not None else {}
    return QueueChooser(
        shards, lambda topic, q: shard_of_queue(topic, q, shards), lambda shard: races.get(shard, 0)
    )


def test_one_shard_is_plain_round_robin_from_queue_zero_per_topic() -> None:
    chooser = _chooser(1)
    assert [chooser.next("A", 4) for _ in range(6)] == [0, 1, 2, 3, 0, 1]
    assert [chooser.next("B", 3) for _ in range(4)] == [0, 1, 2, 0]


@pytest.mark.parametrize(("shards", "queues"), [(4, 8), (3, 8), (4, 4), (2, 7)])
def test_without_lost_races_stints_cycle_every_shard_and_every_queue_gets_its_share(
    shards: int, queues: int
) -> None:
    chooser = _chooser(shards)
    picks = [chooser.next(TOPIC, queues) for _ in range(STINT_ROUNDS * queues * 2)]  # two cycles
    shards_of = [shard_of_queue(TOPIC, q, shards) for q in picks]
    visited = [s for i, s in enumerate(shards_of) if i == 0 or s != shards_of[i - 1]]
    assert len(visited) == 2 * shards  # a stint keeps to one shard ...
    assert sorted(visited[:shards]) == list(range(shards))  # ... a cycle visits every shard once
    assert visited[:shards] == visited[shards:]  # in the same order each cycle
    for shard in range(shards):  # each stint goes STINT_ROUNDS times round its shard's queues
        held = sum(1 for q in range(queues) if shard_of_queue(TOPIC, q, shards) == shard)
        assert shards_of.count(shard) == 2 * STINT_ROUNDS * held
    assert Counter(picks) == dict.fromkeys(range(queues), 2 * STINT_ROUNDS)  # every queue its share


def test_a_lost_race_moves_the_next_send_to_another_shard_at_once() -> None:
    lost: dict[int, int] = {}
    chooser = _chooser(4, lost)
    first = shard_of_queue(TOPIC, chooser.next(TOPIC, 8), 4)
    assert shard_of_queue(TOPIC, chooser.next(TOPIC, 8), 4) == first
    lost[first] = 1
    moved = shard_of_queue(TOPIC, chooser.next(TOPIC, 8), 4)
    assert moved != first
    assert shard_of_queue(TOPIC, chooser.next(TOPIC, 8), 4) == moved  # and stays there
    lost[first] = 5  # races lost on a shard it left do not move it again
    assert shard_of_queue(TOPIC, chooser.next(TOPIC, 8), 4) == moved


def test_only_shards_holding_the_topics_queues_are_used_and_a_lone_shard_is_kept_after_a_loss() -> None:
    lost: dict[int, int] = {}
    chooser = _chooser(4, lost)
    picks = [chooser.next(TOPIC, 2) for _ in range(STINT_ROUNDS * 8)]
    assert set(picks) == {0, 1}
    single = _chooser(4, lost)
    assert single.next(TOPIC, 1) == 0
    lost[shard_of_queue(TOPIC, 0, 4)] = 3
    assert single.next(TOPIC, 1) == 0


def test_choosers_started_together_do_not_all_begin_on_one_shard() -> None:
    firsts = {shard_of_queue(TOPIC, _chooser(4).next(TOPIC, 8), 4) for _ in range(40)}
    assert len(firsts) > 1
