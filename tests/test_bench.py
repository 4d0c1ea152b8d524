"""The benchmark's pure helpers: statistics, target verdicts and the Markdown report (no timing)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from bench.report import TARGETS, Condition, Target, evaluate, fmt_ms, render, times, workload_table
from bench.run import context_note, parse_args
from bench.stats import latency, percentile, rate, ratio, timed_ms, unavailable
from bench.workloads import BARE, OURS, REDIS
from bench.workloads.flow import decode, delays_of, encode
from bench.workloads.produce import batch_sizes
from bench.workloads.pull import PULL, positions


def test_percentile_is_nearest_rank():
    samples = list(range(1, 101))  # 1..100
    assert percentile(samples, 50) == 50
    assert percentile(samples, 99) == 99
    assert percentile(samples, 100) == 100
    assert percentile(samples, 0) == 1
    assert percentile([7.0], 99) == 7.0


def test_percentile_of_nothing_is_nan_and_out_of_range_is_refused():
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_latency_summary_ignores_sample_order():
    assert latency([3.0, 1.0, 2.0, 4.0]) == {"p50_ms": 2.0, "p99_ms": 4.0, "mean_ms": 2.5, "n": 4}
    assert latency([]) == unavailable("no samples")


def test_rate_is_messages_per_second_and_needs_a_duration():
    assert rate(1000, 0.5) == {"msg_s": 2000, "n": 1000, "seconds": 0.5}
    with pytest.raises(ValueError):
        rate(10, 0)


def test_ratio_compares_headline_numbers_and_is_none_without_a_peer():
    assert ratio(rate(100, 1), rate(400, 1)) == 0.25
    assert ratio(latency([6.0]), latency([2.0])) == 3.0
    assert ratio(rate(100, 1), unavailable("no redis")) is None
    assert ratio(rate(100, 1), None) is None


def test_timed_ms_stops_at_its_budget_once_it_has_the_minimum_samples():
    calls: list[int] = []
    samples = timed_ms(calls.append, 50, budget_s=0.0, min_samples=3)
    assert calls == [0, 1, 2]
    assert len(samples) == 3
    assert all(s >= 0 for s in samples)


def test_timed_ms_without_budget_calls_every_index():
    calls: list[int] = []
    assert len(timed_ms(calls.append, 5)) == 5
    assert calls == [0, 1, 2, 3, 4]


def test_batch_sizes_cover_the_total_with_a_short_last_batch():
    assert batch_sizes(10, 4) == [4, 4, 2]
    assert batch_sizes(8, 4) == [4, 4]


def test_pull_positions_stay_inside_each_queue():
    bounds = {0: (0, 100), 1: (10, 50), 2: (0, 5)}  # queue 2 is too short for a pull of 32
    for q, offset in positions(bounds, 200, seed=1, tail=False):
        lo, hi = bounds[q]
        assert q != 2
        assert lo <= offset <= hi - PULL
    assert positions(bounds, 4, seed=1, tail=True) == [(0, 68), (1, 18), (0, 68), (1, 18)]


def test_sequence_numbers_survive_the_body_encoding():
    body = encode(123456789, 1024)
    assert len(body) == 1024
    assert decode(body) == 123456789


def test_delays_count_messages_never_seen():
    measure = delays_of([1000.0, 2000.0, 3000.0], {0: 1500.0, 2: 3100.0})
    assert measure["n"] == 2
    assert measure["p50_ms"] == 100.0
    assert measure["p99_ms"] == 500.0
    assert measure["missing"] == 1


def _workload(wid: str, kind: str, systems: dict[str, Any]) -> dict[str, Any]:
    return {"id": wid, "title": wid, "kind": kind, "systems": systems, "notes": ["a note"]}


def test_a_target_is_met_only_when_every_condition_holds():
    target = Target("t", "w", (Condition("p50_ms", "<=", 10), Condition("p99_ms", "<=", 50)))
    good = {"w": _workload("w", "latency", {OURS: latency([5.0] * 98 + [40.0] * 2)})}
    bad = {"w": _workload("w", "latency", {OURS: latency([5.0] * 98 + [60.0] * 2)})}
    assert evaluate(target, good) == ("p50 5.00 ms, p99 40.0 ms", True)
    assert evaluate(target, bad)[1] is False
    assert evaluate(target, {}) == ("not measured", None)


def test_a_ratio_target_uses_the_peer_measured_in_the_same_run():
    target = Target("t", "w", (Condition(f"ratio:{BARE}", ">=", 0.5),))
    workloads = {"w": _workload("w", "rate", {OURS: rate(60, 1), BARE: rate(100, 1)})}
    assert evaluate(target, workloads) == (f"60% of {BARE}", True)
    workloads["w"]["systems"][BARE] = unavailable("not run")
    assert evaluate(target, workloads) == ("not measured", None)


def test_messages_never_seen_fail_a_latency_target():
    target = Target("t", "w", (Condition("p99_ms", "<=", 1500),))
    measure = delays_of([0.0, 0.0], {0: 10.0})
    assert evaluate(target, {"w": _workload("w", "latency", {OURS: measure})}) == (
        "p99 10.0 ms, 1 messages never seen",
        False,
    )


def test_workload_table_shows_ratios_and_unavailable_peers():
    workload = _workload(
        "w", "rate", {OURS: rate(50, 1), BARE: rate(100, 1), REDIS: unavailable("redis-server missing")}
    )
    lines = workload_table(workload)
    assert lines[2] == "| lakemq | 50 | 50 | 1.00 | — |"
    assert lines[3] == "| bare delta-rs | 100 | 100 | 1.00 | 50% |"
    assert lines[4] == "| Redis Streams | not available: redis-server missing |  |  | — |"


def test_latency_ratios_read_as_slower_or_faster():
    assert times(3.0) == "3.0x slower"
    assert times(0.05) == "20x faster"
    assert times(1.04) == "1.04x slower"


def test_fmt_ms_keeps_the_precision_that_matters():
    assert fmt_ms(0.3456) == "0.35 ms"
    assert fmt_ms(12.34) == "12.3 ms"
    assert fmt_ms(4595.8) == "4,596 ms"


def test_report_has_machine_targets_and_one_table_per_workload():
    results = {
        "command": "bash bench/run.sh",
        "date": "2026-01-01 00:00 UTC",
        "mode": "quick",
        "elapsed_s": 100.0,
        "machine": {
            "cpu_model": "Some CPU",
            "cores": 2,
            "ram_gib": 8.0,
            "platform": "Linux",
            "load_average_start": [1.5, 1.0, 0.5],
            "load_average_end": [1.0, 1.0, 0.5],
            "load_after_steps": {"produce": [2.5], "sync": [3.0]},
        },
        "versions": {"python": "3.11.9", "redis-server": "7.0.15"},
        "params": {"messages": 1000},
        "context_note": context_note([1.5, 1.0, 0.5], 2),
        "workloads": [
            _workload("produce_batched", "rate", {OURS: rate(200_000, 1), BARE: rate(300_000, 1)}),
            _workload("send_sync", "latency", {OURS: latency([40.0]), REDIS: latency([0.1])}),
        ],
    }
    text = render(results)
    assert "| CPU | Some CPU, 2 cores |" in text
    assert "| load average (1/5/15 min) at start | 1.5 / 1.0 / 0.5 |" in text
    assert "| 1-min load average after each step | produce 2.5, sync 3.0 |" in text
    assert "| redis-server | 7.0.15 |" in text
    assert "The machine was busy" in text
    assert f"**2 of {len(TARGETS)} targets met.**" in text
    assert "| batched produce, 1 KiB: >= 150k msg/s | 200,000 msg/s | 67% | — | **MET** |" in text
    assert "| single synchronous send: p50 <= 30 ms | p50 40.0 ms | — | 400x slower | **NOT MET** |" in text
    assert text.count("### ") == 2


def test_a_quiet_machine_gets_no_busy_note():
    assert context_note([0.2, 0.1, 0.1], 2) == ""


def test_run_refuses_unknown_steps(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit):
        parse_args(["--only", "produce,nonsense"])
    assert "nonsense" in capsys.readouterr().err
    assert parse_args(["--only", "pull,replay"]).steps == ["pull", "replay"]


def test_interleaved_rates_warm_every_case_once_then_alternate_them_round_by_round() -> None:
    from bench.workloads.replay import interleaved_rates

    calls: list[str] = []

    def case(name: str) -> Any:
        def run() -> int:
            calls.append(name)
            return 10

        return run

    measures = interleaved_rates({"a": case("a"), "b": case("b")}, 10, 3)
    assert calls == ["a", "b"] * 4  # one warm-up round, then three timed ones
    assert set(measures) == {"a", "b"}
    assert all(m["runs"] == 3 and m["n"] == 10 and m["best_msg_s"] >= m["msg_s"] for m in measures.values())
    with pytest.raises(RuntimeError, match="read 10 rows, expected 11"):
        interleaved_rates({"a": case("a")}, 11, 1)
