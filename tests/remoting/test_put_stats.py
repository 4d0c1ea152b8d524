"""The door's put statistics: RocketMQ's ranges, totals, the longest put, the last minute's spread."""

from __future__ import annotations

import pytest

from engine.remoting.put_stats import MINUTE_S, RANGES, PutStats, range_of


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("elapsed_ms", "name"),
    [
        (-1, "[<=0ms]"),
        (0, "[<=0ms]"),
        (1, "[0~10ms]"),
        (9, "[0~10ms]"),
        (10, "[10~50ms]"),
        (49, "[10~50ms]"),
        (50, "[50~100ms]"),
        (199, "[100~200ms]"),
        (200, "[200~500ms]"),
        (999, "[500ms~1s]"),
        (1000, "[1~2s]"),
        (2999, "[2~3s]"),
        (3000, "[3~4s]"),
        (4999, "[4~5s]"),
        (5000, "[5~10s]"),
        (9999, "[5~10s]"),
        (10000, "[10s~]"),
        (600_000, "[10s~]"),
    ],
)
def test_a_put_falls_in_rocketmqs_range(elapsed_ms: int, name: str) -> None:
    assert RANGES[range_of(elapsed_ms)] == name


def test_totals_the_longest_put_and_the_average_size() -> None:
    stats = PutStats(Clock())
    assert stats.runtime_fields()["putMessageAverageSize"] == "NaN"
    stats.record(0.0004, 1, 1024)  # under a millisecond: [<=0ms], as RocketMQ's whole milliseconds
    stats.record(0.0123, 32, 32 * 1000)
    stats.record(0.0051, 1, 1000)
    fields = stats.runtime_fields()
    assert fields["putMessageTimesTotal"] == "34"
    assert fields["putMessageSizeTotal"] == str(1024 + 32_000 + 1000)
    assert fields["putMessageAverageSize"] == repr((1024 + 32_000 + 1000) / 34)
    assert fields["putMessageEntireTimeMax"] == "12"
    assert fields["putMessageDistributeTime"] == (
        "[<=0ms]:1 [0~10ms]:1 [10~50ms]:1 [50~100ms]:0 [100~200ms]:0 [200~500ms]:0 [500ms~1s]:0 "
        "[1~2s]:0 [2~3s]:0 [3~4s]:0 [4~5s]:0 [5~10s]:0 [10s~]:0 "
    )


def test_the_spread_is_the_last_whole_minutes() -> None:
    clock = Clock()
    stats = PutStats(clock)
    stats.record(0.002, 1, 1)
    assert stats.distribution()[1] == 1  # the first minute: the puts so far
    clock.now += MINUTE_S
    stats.record(0.020, 1, 1)  # a new minute: the last one's spread is shown
    assert stats.distribution() == [0, 1] + [0] * 11
    clock.now += MINUTE_S
    assert stats.distribution() == [0, 0, 1] + [0] * 10
    clock.now += 2 * MINUTE_S  # a whole minute without puts
    assert stats.distribution() == [0] * 13
    assert stats.runtime_fields()["putMessageTimesTotal"] == "2"  # totals are since the start
