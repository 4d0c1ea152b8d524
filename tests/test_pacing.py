"""How long racing commit-log writers wait (engine.store.commit_log.pacing): losers wait shorter the longer
they lose, winners of a hot race give way, nobody waits without rivals or past the cap."""

from __future__ import annotations

import random

import pytest

from engine.store.commit_log.pacing import HOT_APPENDS, MAX_PAUSE_S, RIVALS_WINDOW_S, RacePacer


class _Widest(random.Random):
    """Jitter that always picks the top of its range, so waits can be compared exactly."""

    def uniform(self, a: float, b: float) -> float:
        return b


T0 = 1000.0  # an arbitrary monotonic clock reading (tests never depend on uptime)


def test_a_writer_without_rivals_never_holds_back() -> None:
    pacer = RacePacer(_Widest())
    pacer.lost(1, T0)
    pacer.won(0.01, T0)
    assert pacer.rivals == 0
    assert pacer.hold(T0) == 0.0


def test_rivals_are_the_other_writers_seen_within_the_window() -> None:
    pacer = RacePacer()
    pacer.saw(["me", "a", "b", "a", ""], "me", T0)
    assert pacer.rivals == 3  # a, b and a commit of no writer (maintenance); never itself
    pacer.lost(1, T0 + RIVALS_WINDOW_S + 1)
    assert pacer.rivals == 0


def test_a_winner_of_a_hot_race_gives_way_about_one_commit_time_per_rival() -> None:
    pacer = RacePacer(_Widest())
    pacer.saw(["a", "b", "c"], "me", T0)
    pacer.lost(1, T0)
    pacer.won(0.02, T0)
    expected = pacer.commit_s * 3
    assert pacer.hold(T0) == pytest.approx(expected)
    assert pacer.hold(T0) == 0.0  # held once
    pacer.won(0.02, T0)
    assert pacer.hold(T0 + pacer.commit_s * 3) == 0.0  # time already gone by counts


def test_a_winner_stops_giving_way_once_the_race_cools() -> None:
    pacer = RacePacer(_Widest())
    pacer.saw(["a"], "me", T0)
    pacer.lost(1, T0)
    holds = []
    for _ in range(HOT_APPENDS + 2):
        pacer.won(0.01, T0)
        holds.append(pacer.hold(T0))
    assert all(h > 0 for h in holds[:HOT_APPENDS])
    assert holds[HOT_APPENDS:] == [0.0, 0.0]


def test_the_longer_a_writer_loses_the_shorter_it_waits() -> None:
    pacer = RacePacer(_Widest())
    pacer.saw(["a", "b", "c", "d"], "me", T0)
    waits = [pacer.lost(streak, T0) for streak in (1, 2, 3, 4)]
    assert waits[0] == pytest.approx(pacer.commit_s * 4)
    assert waits == pytest.approx([waits[0] / 2**k for k in range(4)])


def test_every_pause_is_capped() -> None:
    pacer = RacePacer(_Widest())
    pacer.saw([f"w{i}" for i in range(100)], "me", T0)
    for _ in range(20):
        pacer.won(10.0, T0)  # a very slow commit
    pacer.lost(1, T0)
    assert pacer.lost(1, T0) <= MAX_PAUSE_S
    pacer.won(10.0, T0)
    assert pacer.hold(T0) <= MAX_PAUSE_S
