"""The benchmark's pure helpers: statistics, target verdicts and the Markdown report (no timing)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from bench.report import (
    DESIGN_COPY,
    DESIGN_MD,
    DESIGN_TARGETS,
    TARGETS,
    Condition,
    Target,
    design_rows,
    design_section,
    evaluate,
    fmt_ms,
    object_storage_section,
    render,
    times,
    workload_table,
)
from bench.run import context_note, parse_args
from bench.stats import latency, median_measure, percentile, rate, ratio, timed_ms, unavailable
from bench.workloads import BARE, OURS, REDIS, ROCKETMQ
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
    assert evaluate(target, {}) == ("not measured: the `w` workload did not run", None)


def test_a_ratio_target_uses_the_peer_measured_in_the_same_run():
    target = Target("t", "w", (Condition(f"ratio:{BARE}", ">=", 0.5),))
    workloads = {"w": _workload("w", "rate", {OURS: rate(60, 1), BARE: rate(100, 1)})}
    assert evaluate(target, workloads) == (f"60% of {BARE}", True)
    workloads["w"]["systems"][BARE] = unavailable("not run")
    assert evaluate(target, workloads) == (f"not measured: no {BARE} figure in `w`", None)
    workloads["w"]["systems"][OURS] = unavailable("the store refused")
    assert evaluate(target, workloads) == ("not measured: the store refused", None)


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


def _results(workloads: list[dict[str, Any]]) -> dict[str, Any]:
    return {
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
        "workloads": workloads,
    }


def test_report_has_machine_targets_and_one_table_per_workload():
    text = render(
        _results(
            [
                _workload("produce_batched", "rate", {OURS: rate(300_000, 1), BARE: rate(200_000, 1)}),
                _workload("send_async", "rate", {OURS: rate(50_000, 1)}),
            ]
        )
    )
    assert "| CPU | Some CPU, 2 cores |" in text
    assert "| load average (1/5/15 min) at start | 1.5 / 1.0 / 0.5 |" in text
    assert "| 1-min load average after each step | produce 2.5, sync 3.0 |" in text
    assert "| redis-server | 7.0.15 |" in text
    assert "The machine was busy" in text
    assert (
        f"**1 of {len(TARGETS)} targets met** ({len(DESIGN_TARGETS)} rows of DESIGN.md §7, 1 not met," in text
    )
    produce_row = DESIGN_TARGETS[0]
    assert (
        f"| {produce_row.workload} | {produce_row.target} | local: >= 250k msg/s and >= 100 % of a bare "
        "write_deltalake | 300,000 msg/s, 150% of bare delta-rs | **MET** |"
    ) in text
    assert "| async with linger: >= 100k msg/s | 50,000 msg/s | **NOT MET** |" in text
    assert text.count("### ") == 2


def _design_markdown() -> str:
    """DESIGN.md beside the clone (as in CI and the worktrees), else the copy of §7 in bench/."""
    return DESIGN_MD.read_text() if DESIGN_MD.exists() else DESIGN_COPY.read_text()


def test_the_report_judges_every_row_of_design_section_7_in_its_order_and_words():
    rows = design_rows(_design_markdown())
    assert len(rows) >= 11
    assert [(r.workload, r.target) for r in DESIGN_TARGETS] == rows
    assert all(row.parts for row in DESIGN_TARGETS)


def test_the_copy_of_section_7_is_the_design_of_today():
    if not DESIGN_MD.exists():
        pytest.skip(f"{DESIGN_MD} is not beside the clone")
    assert DESIGN_COPY.read_text() == design_section(DESIGN_MD.read_text()), (
        "DESIGN.md §7 changed: update bench/design_targets.md and DESIGN_TARGETS in bench/report.py"
    )


def test_design_rows_reads_only_the_targets_table_of_section_7():
    markdown = (
        "# D\n## 6. Deps\n| a | b |\n|---|---|\n| x | y |\n"
        "## 7. Targets\n| workload | target |\n|---|---|\n| w1 | t1 |\n| w2 | t2 (a | b) |\n"
        "| w3 | t3 |\n## 8. Faults\n| f | g |\n"
    )
    assert design_rows(markdown) == [("w1", "t1"), ("w3", "t3")]
    with pytest.raises(ValueError, match="no section"):
        design_section("# nothing here\n")


def test_a_report_of_an_empty_run_shows_every_row_not_measured_with_a_reason():
    text = render(_results([]))
    table = text.split("## Targets", 1)[1].split("\n\n", 3)[2]
    lines = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(lines) == len(TARGETS)
    assert all("| **not measured** |" in line and "not measured: " in line for line in lines)
    for row in DESIGN_TARGETS:
        assert f"| {row.workload} | {row.target} |" in text
    assert "the `failover` workload did not run" in text
    assert "the `s3_rtt20_end_to_end` workload did not run" in text


def test_the_sync_send_is_judged_against_rocketmqs_sync_send_of_the_same_run():
    target = next(t for t in TARGETS if t.workload == "send_sync")
    ours = {"send_sync": _workload("send_sync", "latency", {OURS: latency([0.8])})}
    assert evaluate(target, ours) == ("not measured: no RocketMQ figure (`wire_sync`) in this run", None)
    wire = _workload("wire_sync", "latency", {OURS: latency([3.0]), ROCKETMQ: latency([0.5])})
    assert evaluate(target, {**ours, "wire_sync": wire}) == ("p50 0.80 ms (RocketMQ: p50 0.50 ms)", False)
    wire["systems"][ROCKETMQ] = latency([1.2])
    assert evaluate(target, {**ours, "wire_sync": wire})[1] is True


def _s3_workload(profile: str, what: str, kind: str, systems: dict[str, Any]) -> dict[str, Any]:
    workload = _workload(f"s3_{profile}_{what}", kind, systems)
    workload.update(profile=profile, what=what, title=f"Object storage ({profile}): {what}")
    return workload


def test_object_storage_targets_are_judged_on_the_injected_profile_in_round_trips():
    fast = {**latency([30.0] * 10), "requests_per_op": 2.0, "rtt_ms": 20.0, "p50_rtts": 1.5, "p99_rtts": 1.5}
    slow = {**latency([200.0] * 10), "requests_per_op": 9.0, "p50_rtts": 10.0, "p99_rtts": 10.0}
    one = {**rate(100, 1), "gave_up": 0, "failures": 0}
    four = {**rate(300, 1), "gave_up": 1, "failures": 0, "x_one_shard": 3.0}
    workloads = [
        _s3_workload("loopback", "pull", "latency", {OURS: slow}),
        _s3_workload("rtt20", "pull", "latency", {OURS: fast}),
        _s3_workload("rtt20", "produce_batched", "rate", {OURS: rate(900, 1), BARE: rate(1000, 1)}),
        _s3_workload("rtt20", "writers_1", "rate", {OURS: one}),
        _s3_workload("rtt20", "writers_4", "rate", {OURS: four}),
        # p50 52 ms: the round trip measured during the sends was 22 ms (20 injected + the server's 2)
        _s3_workload("rtt20", "send_sync", "latency", {OURS: {**latency([52.0, 55, 40]), "rtt_ms": 22.0}}),
    ]
    by_id = {w["id"]: w for w in workloads}
    verdicts = {t.workload: evaluate(t, by_id)[1] for t in TARGETS if (t.workload or "").startswith("s3_")}
    assert verdicts == {
        "s3_rtt20_produce_batched": True,
        "s3_rtt20_pull": True,  # 30 ms <= 3 x 20 ms; the loopback profile is not judged
        "s3_rtt20_end_to_end": None,
        "s3_rtt20_writers_4": False,  # 3x one shard, but one writer gave up
        "s3_rtt20_writers_1": True,
        "s3_rtt20_send_sync": True,  # 52 ms <= 2 x 22 ms + 10 ms
    }
    send_sync = next(t for t in TARGETS if t.workload == "s3_rtt20_send_sync")
    assert evaluate(send_sync, by_id)[0] == "p50 52.0 ms (round trip 22.0 ms: limit 54.0 ms)"
    by_id["s3_rtt20_send_sync"]["systems"][OURS]["rtt_ms"] = 20.0  # the same sends over a faster store
    assert evaluate(send_sync, by_id) == ("p50 52.0 ms (round trip 20.0 ms: limit 50.0 ms)", False)
    del by_id["s3_rtt20_send_sync"]["systems"][OURS]["rtt_ms"]
    unmeasured = "not measured: no round trip measured in `s3_rtt20_send_sync`"
    assert evaluate(send_sync, by_id) == (unmeasured, None)
    section = object_storage_section(_results(workloads))
    assert section[0] == "## Object storage"
    assert (
        "| workload | loopback lakemq | loopback bare delta-rs | rtt20 lakemq | rtt20 bare delta-rs |"
        in section
    )
    pull_row = next(line for line in section if line.startswith("| pull |"))
    assert "p50 200 ms, p99 200 ms (10 / 10 round trips); 9 requests per op" in pull_row
    assert "p50 30.0 ms, p99 30.0 ms (1.5 / 1.5 round trips); 2 requests per op" in pull_row
    produce_row = next(line for line in section if line.startswith("| produce_batched |"))
    assert "1,000 msg/s (lakemq: 90%)" in produce_row
    writers_row = next(line for line in section if line.startswith("| writers_4 |"))
    assert "| 300 msg/s; 1 gave up, 0 lost races; 3.00x one shard |" in writers_row
    assert object_storage_section(_results([])) == []
    text = render(_results(workloads))
    assert "## Object storage" in text and "### Object storage" not in text


def test_a_quiet_machine_gets_no_busy_note():
    assert context_note([0.2, 0.1, 0.1], 2) == ""


def test_run_refuses_unknown_steps(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit):
        parse_args(["--only", "produce,nonsense"])
    assert "nonsense" in capsys.readouterr().err
    assert parse_args(["--only", "pull,replay"]).steps == ["pull", "replay"]
    assert parse_args(["--only", "s3"]).steps == ["s3"]
    assert "s3" in parse_args([]).steps  # the full run includes object storage


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


def test_an_update_is_refused_unless_the_results_it_updates_are_a_full_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # An update of a partial run would write a report whose other targets read "not measured".
    out = tmp_path / "latest.json"
    every = parse_args([]).steps
    for held in (None, "not json", {"workloads": []}, {"steps": ["wire"], "workloads": []}):
        if held is None:
            out.unlink(missing_ok=True)
        else:
            out.write_text(held if isinstance(held, str) else json.dumps(held))
        with pytest.raises(SystemExit):
            parse_args(["--update", "--only", "wire", "--out", str(out)])
        assert "run the whole benchmark first" in capsys.readouterr().err
    out.write_text(json.dumps({"steps": every, "workloads": []}))
    assert parse_args(["--update", "--only", "wire", "--out", str(out)]).steps == ["wire"]


def test_an_update_replaces_the_workloads_it_measured_again_and_the_report_says_so() -> None:
    from bench.run import updated

    def rate_of(wid: str, msg_s: float) -> dict[str, Any]:
        return _workload(wid, "rate", {OURS: {"msg_s": msg_s, "n": 10}})

    base = {**_results([rate_of("ack_4proc", 1.0), rate_of("pull_random", 2.0)]), "date": "D0"}
    again = {
        **_results([rate_of("ack_4proc", 3.0)]),
        "date": "D1",
        "elapsed_s": 12.0,
        "errors": ["ack: something"],
    }
    again["machine"] = {**again["machine"], "load_average_start": [0.3, 0.2, 0.1]}
    merged = updated(base, again, ["ack"])
    by_id = {w["id"]: w for w in merged["workloads"]}
    assert by_id["ack_4proc"]["systems"]["lakemq"]["msg_s"] == 3.0
    assert by_id["pull_random"]["systems"]["lakemq"]["msg_s"] == 2.0
    assert merged["date"] == "D0" and merged["errors"] == ["ack: something"]
    text = render(merged)
    assert "Steps measured again on D1 (`--update`, 1-min load average 0.3 at its start, 12 s): ack" in text
    # measured again: the earlier update keeps only the steps the later one did not measure
    merged["updates"][0]["steps"] = ["ack", "pull"]
    later = updated(merged, {**again, "date": "D2"}, ["ack"])
    assert [(u["date"], u["steps"]) for u in later["updates"]] == [("D1", ["pull"]), ("D2", ["ack"])]
    assert [u["date"] for u in updated(later, {**again, "date": "D3"}, ["ack", "pull"])["updates"]] == ["D3"]


def test_the_median_of_runs_takes_each_figures_median_and_adds_up_samples_and_time() -> None:
    runs = [
        {"msg_s": 600, "n": 4000, "seconds": 6.6, "server_cpu_ms_1k": 1750.0, "failures": 1},
        {"msg_s": 450, "n": 4000, "seconds": 8.9, "server_cpu_ms_1k": 2470.0},
        unavailable("RocketMQ did not start"),
        {"msg_s": 650, "n": 4000, "seconds": 6.1, "server_cpu_ms_1k": 1630.0, "note": "x"},
    ]
    assert median_measure(runs) == {
        "msg_s": 600,
        "n": 12000,
        "seconds": 21.6,
        "server_cpu_ms_1k": 1750.0,
        "failures": 1,
        "note": "x",
        "runs": 3,
    }
    latencies = [latency([1.0, 2.0, 9.0]), latency([4.0, 5.0, 6.0])]
    merged = median_measure(latencies)
    assert merged["p50_ms"] == 3.5 and merged["n"] == 6 and merged["runs"] == 2  # two runs: the mean
    assert median_measure([unavailable("a"), unavailable("b")]) == unavailable("a")
    with pytest.raises(ValueError, match="no runs"):
        median_measure([])
