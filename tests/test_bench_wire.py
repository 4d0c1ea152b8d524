"""The wire benchmark's and the Java harness's pure parts: measures from the Java bench's phases, the
RocketMQ section of BENCHMARKS.md, the harness's cache key and its scenario output (no JVM, no timing)."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from bench.java_harness import HarnessError, ScenarioRun, options, sources_hash
from bench.peers import stop_process_group
from bench.report import render, rocketmq_section
from bench.rocketmq_peer import broker_port
from bench.workloads import OURS, ROCKETMQ
from bench.workloads.wire import WORKLOADS, measures


def phases(consumed: int = 1050, failures: int = 0) -> list[dict[str, Any]]:
    return [
        {"event": "phase", "phase": "sync", "messages": 4, "seconds": 2.0, "failures": failures,
         "latencies_ms": [1.0, 2.0, 3.0, 10.0]},
        {"event": "phase", "phase": "batch", "messages": 1000, "seconds": 0.5, "failures": 0},
        {"event": "phase", "phase": "consume", "messages": consumed, "expected": 1054, "seconds": 2.0},
        {"event": "received", "key": "not a phase"},
    ]  # fmt: skip


def test_measures_turn_the_java_phases_into_a_latency_and_three_rates() -> None:
    got = measures(phases(consumed=1054))
    assert got["wire_sync"] == {"p50_ms": 2.0, "p99_ms": 10.0, "mean_ms": 4.0, "n": 4}
    assert got["wire_sync_rate"] == {"msg_s": 2, "n": 4, "seconds": 2.0}
    assert got["wire_batch"] == {"msg_s": 2000, "n": 1000, "seconds": 0.5}
    assert got["wire_consume"] == {"msg_s": 527, "n": 1054, "seconds": 2.0}
    assert set(got) == {w[0] for w in WORKLOADS}


def test_measures_say_how_many_messages_the_consumer_never_saw_and_how_many_sends_failed() -> None:
    got = measures(phases(consumed=1050, failures=3))
    assert got["wire_consume"]["missing"] == 4
    assert got["wire_sync"]["failures"] == got["wire_batch"]["failures"] == 3


def test_measures_of_an_incomplete_run_are_unavailable_not_zero() -> None:
    got = measures(phases()[:2])
    assert all("unavailable" in m for m in got.values()) and set(got) == {w[0] for w in WORKLOADS}


def _results(workloads: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "command": "bash bench/run.sh --quick", "date": "2026-11-24 12:00 UTC", "mode": "quick",
        "elapsed_s": 60,
        "machine": {"cpu_model": "cpu", "cores": 2, "ram_gib": 8, "platform": "linux",
                    "load_average_start": [0.1, 0.1, 0.1], "load_average_end": [0.2, 0.2, 0.2]},
        "versions": {}, "params": {}, "workloads": workloads, "extra": {"rocketmq_broker": "4.9.7"},
    }  # fmt: skip


def test_the_rocketmq_section_gives_each_wire_workload_lakemq_beside_rocketmq_with_the_ratio() -> None:
    rate_w = {
        "id": "wire_batch",
        "title": "batches",
        "kind": "rate",
        "notes": [],
        "systems": {
            OURS: {"msg_s": 2500, "n": 10, "seconds": 1},
            ROCKETMQ: {"msg_s": 5000, "n": 10, "seconds": 1},
        },
    }
    latency_w = {"id": "wire_sync", "title": "one send", "kind": "latency", "notes": [],
                 "systems": {OURS: {"p50_ms": 12.0, "p99_ms": 40.0, "mean_ms": 14.0, "n": 5},
                             ROCKETMQ: {"p50_ms": 3.0, "p99_ms": 9.0, "mean_ms": 4.0, "n": 5}}}  # fmt: skip
    section = rocketmq_section(_results([rate_w, latency_w]))
    assert section[0] == "## lakemq vs the real RocketMQ broker" and "4.9.7" in section[2]
    assert "| batches | 2,500 msg/s | 5,000 msg/s | 50% |" in section
    assert "| one send | p50 12.0 ms, p99 40.0 ms | p50 3.00 ms, p99 9.00 ms | 4.0x slower |" in section
    assert "## lakemq vs the real RocketMQ broker" in render(_results([rate_w, latency_w]))


def test_the_rocketmq_section_names_why_rocketmq_was_not_measured_and_is_absent_without_wire_workloads() -> (
    None
):
    down = {"id": "wire_batch", "title": "batches", "kind": "rate", "notes": [],
            "systems": {OURS: {"msg_s": 2500, "n": 10, "seconds": 1},
                        ROCKETMQ: {"unavailable": "did not start"}}}  # fmt: skip
    assert "| batches | 2,500 msg/s | not available: did not start | — |" in rocketmq_section(
        _results([down])
    )
    other = {"id": "send_sync", "title": "x", "kind": "rate", "notes": [], "systems": {OURS: {"msg_s": 1}}}
    assert rocketmq_section(_results([other])) == []
    assert "RocketMQ broker\n" not in render(_results([other]))


def test_options_become_java_command_line_pairs() -> None:
    assert options({"namesrv": "h:1", "retry_delay_level": 1}) == [
        "--namesrv",
        "h:1",
        "--retry-delay-level",
        "1",
    ]


def test_the_harness_cache_key_changes_with_any_source_and_only_then(tmp_path: Path) -> None:
    (tmp_path / "src" / "main").mkdir(parents=True)
    (tmp_path / "pom.xml").write_text("<project/>")
    source = tmp_path / "src" / "main" / "A.java"
    source.write_text("class A {}")
    first = sources_hash(tmp_path)
    assert sources_hash(tmp_path) == first
    source.write_text("class A { int x; }")
    assert sources_hash(tmp_path) != first
    source.write_text("class A {}")
    assert sources_hash(tmp_path) == first
    (tmp_path / "src" / "main" / "B.java").write_text("class B {}")
    assert sources_hash(tmp_path) != first


def test_a_scenario_run_sorts_events_by_kind_and_refuses_one_that_did_not_finish() -> None:
    events = ({"event": "sent", "key": "a"}, {"event": "sent", "key": "b"}, {"event": "done", "count": 2})
    run = ScenarioRun(events, 0, "")
    assert [e["key"] for e in run.of("sent")] == ["a", "b"] and run.done() == {"event": "done", "count": 2}
    with pytest.raises(HarnessError, match="exit code 0"):
        ScenarioRun(events[:2], 0, "").done()
    with pytest.raises(HarnessError, match=r"(?s)exit code 1.*boom"):
        ScenarioRun(events, 1, "boom").done()


def test_the_broker_port_leaves_room_for_rocketmqs_vip_and_ha_ports() -> None:
    port = broker_port()
    for neighbour in (port - 2, port, port + 1):
        with socket.socket() as s:
            s.bind(("127.0.0.1", neighbour))  # free: binding does not raise


def test_stopping_a_process_group_ends_the_process_and_what_it_started() -> None:
    proc = subprocess.Popen(["bash", "-c", "sleep 300 & sleep 300; wait"], start_new_session=True)
    stop_process_group(proc)
    assert proc.returncode is not None
    gone = False
    for _ in range(100):  # the background sleep is reaped by init once killed
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            gone = True
            break
        time.sleep(0.05)
    assert gone
    stop_process_group(proc)  # stopping an ended process is a no-op
