"""Which queue a producer sends to when the caller names none (no ``queue_id``, no sharding key).

In a store of one commit-log shard: round robin over the topic's queues from queue 0, as RocketMQ's
producer (``selectOneMessageQueue``).

With several shards, round robin over the queues of *one shard at a time*. A producer is its own
sequencer: before it commits to a shard it reads every commit that shard took since its last one
there (the next offsets live in those commits), and two producers on one shard race for its next
version, the loser writing its data file again. Plain round robin over all queues makes every
producer follow every shard and meet every other producer on each, so 4 shards cost 8 producers as
much CPU as one shard does. Here a producer keeps to one shard for a *stint* that goes
:data:`STINT_ROUNDS` times round that shard's queues of the topic, then moves on to the next shard,
so that over a cycle every queue gets the same share as with plain round robin. It leaves at once
for another shard, picked at random, after losing a race on its shard: the spirit of RocketMQ's
``sendLatencyFaultEnable``, which keeps a producer off a broker that was slow. Producers thus spread
over the shards and mostly stay apart. Where the first stint starts is random, so producers started
together do not all begin on one shard.
"""

from __future__ import annotations

import itertools
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass

# How many times a producer goes round one shard's queues of a topic before it moves to the next.
STINT_ROUNDS = 16


@dataclass
class _Stint:
    shard: int
    sent: int
    lost: int  # races the shard's writer had lost when the stint began


@dataclass(frozen=True)
class _Layout:
    queues: list[list[int]]  # the topic's queues of each shard (empty for a shard holding none)
    held: list[int]  # the shards holding some, in order


class QueueChooser:
    """Picks the queue of each send that names none; thread-safe.

    Args:
        shards: the store's commit-log shards.
        shard_of: the shard of ``(topic, queue_id)``.
        lost_races: how many races the producer's writer of a shard has lost so far.
    """

    def __init__(
        self, shards: int, shard_of: Callable[[str, int], int], lost_races: Callable[[int], int]
    ) -> None:
        self._shards = shards
        self._shard_of = shard_of
        self._lost_races = lost_races
        self._round_robin: dict[str, itertools.count[int]] = {}
        self._layouts: dict[tuple[str, int], _Layout] = {}
        self._stints: dict[str, _Stint] = {}
        self._cursors: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()

    def next(self, topic: str, queues: int) -> int:
        """The queue of ``topic`` (which has ``queues`` queues) the next send goes to."""
        if self._shards == 1:
            # dict.setdefault and next() on a count are atomic under the GIL: no lock here.
            counter = self._round_robin.get(topic)
            if counter is None:
                counter = self._round_robin.setdefault(topic, itertools.count())
            return next(counter) % queues
        with self._lock:
            layout = self._layout(topic, queues)
            stint = self._stint(topic, layout)
            mine = layout.queues[stint.shard]
            cursor = self._cursors.get((topic, stint.shard), 0)
            self._cursors[topic, stint.shard] = cursor + 1
            stint.sent += 1
            return mine[cursor % len(mine)]

    def _layout(self, topic: str, queues: int) -> _Layout:
        """Where the topic's queues live (made once per topic and queue count)."""
        layout = self._layouts.get((topic, queues))
        if layout is None:
            per_shard: list[list[int]] = [[] for _ in range(self._shards)]
            for q in range(queues):
                per_shard[self._shard_of(topic, q)].append(q)
            held = [s for s, mine in enumerate(per_shard) if mine]
            layout = self._layouts[topic, queues] = _Layout(per_shard, held)
        return layout

    def _stint(self, topic: str, layout: _Layout) -> _Stint:
        """The topic's stint, moved to another shard when it is over or lost a race."""
        held = layout.held
        stint = self._stints.get(topic)
        if stint is None or stint.shard not in held:
            shard = random.choice(held)
        elif self._lost_races(stint.shard) > stint.lost and len(held) > 1:
            shard = random.choice([s for s in held if s != stint.shard])
        elif stint.sent >= STINT_ROUNDS * len(layout.queues[stint.shard]):
            shard = held[(held.index(stint.shard) + 1) % len(held)]
        else:
            return stint
        stint = self._stints[topic] = _Stint(shard, 0, self._lost_races(shard))
        return stint
