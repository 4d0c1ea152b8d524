"""The wire benchmark's and the Java harness's pure parts: measures from the Java bench's phases, the
RocketMQ section of BENCHMARKS.md, the harness's cache key and its scenario output (no JVM, no timing)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from bench.java_harness import (
    HarnessError,
    ScenarioRun,
    harness_classpath,
    java_command,
    options,
    sources_hash,
)
from bench.lakemq_server import LakemqServer
from bench.machine import cpu_seconds, file_create_us, machine_cpu_seconds, process_tree
from bench.peers import stop_process_group
from bench.report import render, rocketmq_section, wire_cpu_lines
from bench.rocketmq_peer import broker_port
from bench.stats import cpu_ceiling
from bench.workloads import OURS, ROCKETMQ
from bench.workloads.wire import WORKLOADS, CpuMark, commit_log_version, measures, run_with_cpu
from engine import Admin, Message, Producer, Store


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


def test_measures_carry_each_phases_cpu_per_thousand_messages_for_the_sides_read_at_both_ends() -> None:
    # marks: CPU seconds (server, client, machine, steal) at the scenario's start, at the end of its
    # warm-up and at each phase's end; none at the batch's end
    marks = {
        0: CpuMark(0.0, 0.0, 0.0, 0.0),
        1: CpuMark(1.0, 2.0, 10.0, 0.5),
        2: CpuMark(1.02, 2.5, 10.6, 0.504),
        4: CpuMark(3.0, None, 20.0, 1.0),
    }
    got = measures(phases(consumed=1054), marks)
    assert got["wire_sync_rate"]["server_cpu_ms_1k"] == 5000.0  # 20 ms over 4 messages
    assert "messages_per_commit" not in got["wire_sync_rate"]  # no commits read
    assert got["wire_sync_rate"]["client_cpu_ms_1k"] == 125000.0
    assert got["wire_sync_rate"]["others_cpu_ms_1k"] == 20000.0  # 600 ms busy, 520 of them theirs
    assert got["wire_sync_rate"]["steal_ms_1k"] == 1000.0
    assert "server_cpu_ms_1k" not in got["wire_batch"]  # its end was not read
    assert "server_cpu_ms_1k" not in got["wire_consume"]  # nor its start
    assert "server_cpu_ms_1k" not in got["wire_sync"]  # a latency carries none
    client_gone = measures(phases(), {1: CpuMark(1.0, 2.0, 3.0, 0.0), 2: CpuMark(1.5, None, 4.0, 0.0)})
    assert set(client_gone["wire_sync_rate"]) - {"msg_s", "n", "seconds"} == {
        "server_cpu_ms_1k",
        "steal_ms_1k",
    }
    assert "server_cpu_ms_1k" not in measures(phases())["wire_batch"]  # no marks at all


def test_measures_carry_each_phases_messages_per_commit_when_the_server_s_commits_were_read() -> None:
    marks = {
        1: CpuMark(1.0, 2.0, 10.0, 0.5, commits=10),
        2: CpuMark(1.02, 2.5, 10.6, 0.504, commits=12),  # 4 sync sends in 2 commits
        3: CpuMark(2.0, 3.0, 12.0, 0.6, commits=14),  # 1,000 batched in 2
        4: CpuMark(3.0, 4.0, 20.0, 1.0, commits=14),  # consuming commits nothing to the commit log
    }
    got = measures(phases(consumed=1054), marks)
    assert got["wire_sync_rate"]["messages_per_commit"] == 2.0
    assert got["wire_batch"]["messages_per_commit"] == 500.0
    assert "messages_per_commit" not in got["wire_consume"]


def test_the_commit_count_of_a_store_is_its_commit_log_s_latest_version(tmp_path: Path) -> None:
    store = Store.open(str(tmp_path / "s"))
    Admin(store).create_topic("T", 1)
    count = commit_log_version(tmp_path / "s")
    before = count()
    with Producer(store, "P") as producer:
        producer.send(Message("T", b"a"))
        producer.send(Message("T", b"b"))
    assert before is not None and count() == before + 2


def test_the_cpu_ceiling_is_the_rate_at_which_the_cores_would_be_busy_all_the_time() -> None:
    assert cpu_ceiling(150.0, 50.0, 2) == 10_000
    assert cpu_ceiling(30.0, 20.0, 1) == 20_000
    assert cpu_ceiling(0.0, 0.0, 2) == float("inf")


def test_the_wire_cpu_table_puts_each_phase_of_both_systems_beside_its_ceiling() -> None:
    ours = {"msg_s": 9000, "server_cpu_ms_1k": 150.0, "client_cpu_ms_1k": 50.0, "others_cpu_ms_1k": 3.0,
            "steal_ms_1k": 0.5, "messages_per_commit": 96.0}  # fmt: skip
    theirs = {"msg_s": 30000, "server_cpu_ms_1k": 25.0, "client_cpu_ms_1k": 25.0, "others_cpu_ms_1k": 1.0,
              "steal_ms_1k": 0.0}  # fmt: skip
    batch = {"id": "wire_batch", "title": "batches", "kind": "rate", "notes": [],
             "systems": {OURS: ours, ROCKETMQ: theirs}}  # fmt: skip
    half = {"id": "wire_consume", "title": "consume", "kind": "rate", "notes": [],
            "systems": {OURS: {"msg_s": 1, "server_cpu_ms_1k": 10.0, "steal_ms_1k": 0.0},
                        ROCKETMQ: {"unavailable": "did not start"}}}  # fmt: skip
    lines = wire_cpu_lines([batch, half], 2)
    assert f"| batches | {OURS} | 150.0 | 50.0 | 3.0 | 0.5 | 10,000 | 9,000 | 6.0x | 96.0 |" in lines
    assert f"| batches | {ROCKETMQ} | 25.0 | 25.0 | 1.0 | 0.0 | 40,000 | 30,000 |  | — |" in lines
    assert f"| consume | {OURS} | 10.0 | — | — | 0.0 | — | 1 | — | — |" in lines  # its client was not read
    assert not [line for line in lines if line.startswith(f"| consume | {ROCKETMQ}")]
    assert "2 cores" in lines[0]
    plain = {**batch, "systems": {OURS: {"msg_s": 9000}, ROCKETMQ: {"msg_s": 30000}}}
    assert wire_cpu_lines([plain], 2) == []
    assert f"| batches | {OURS} | 150.0" in "\n".join(rocketmq_section(_results([batch])))


_BURN = """
import os, subprocess, sys, time
if sys.argv[1] == "parent":
    child = subprocess.Popen([sys.executable, "-c", __doc__, "child"])
while time.thread_time() < 0.4:
    pass
print("burnt", flush=True)
time.sleep(60)
"""


def test_cpu_seconds_count_a_process_and_its_descendants_and_none_once_it_is_gone() -> None:
    script = f'"""{_BURN}"""\n{_BURN}'
    busy, steal = machine_cpu_seconds()
    parent = subprocess.Popen([sys.executable, "-c", script, "parent"], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        assert parent.stdout.readline() == "burnt\n" and parent.stdout.readline() == "burnt\n"
        tree = process_tree([parent.pid])
        assert len(tree) == 2 and tree[0] == parent.pid
        alone = cpu_seconds([tree[1]])
        both = cpu_seconds([parent.pid])
        assert alone is not None and both is not None
        assert alone >= 0.39 and both >= alone + 0.39  # each burnt 0.4 s of its own CPU, measured by itself
        busy_after, steal_after = machine_cpu_seconds()
        # the machine was busy with them at least (its count is sampled at ticks: a few may differ)
        assert busy_after - busy >= both - 0.1 and steal_after >= steal
    finally:
        for pid in process_tree([parent.pid])[::-1]:
            os.kill(pid, 9)
        parent.wait(10)
    assert cpu_seconds([parent.pid]) is None


@pytest.mark.slow
def test_a_bench_run_against_mq_serve_reads_the_cpu_of_the_server_and_the_client_at_each_phase(
    tmp_path: Path,
) -> None:
    root = tmp_path / "store"
    Admin(Store.open(root)).create_topic("CpuBench", 2)
    with LakemqServer(root, tmp_path / "serve.log") as server:
        assert server.namesrv, server.why
        run, marks = run_with_cpu(
            harness_classpath(), tmp_path / "client", server.pids, 300, namesrv=server.namesrv,
            topic="CpuBench", group="CpuBenchGroup", threads=2, sync_messages=40, batch_messages=320,
            batch_size=32, body_bytes=128, consume_timeout_ms=120_000,
        )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    assert sorted(marks)[:3] == [0, 1, 2]  # the start, the sync and the batch phases' ends at least
    servers = [m.server for m in marks.values()]
    assert all(s is not None for s in servers) and servers == sorted(servers)  # type: ignore[type-var]
    got = measures(list(run.events), marks)
    for workload in ("wire_sync_rate", "wire_batch"):
        assert got[workload]["server_cpu_ms_1k"] > 0 and got[workload]["client_cpu_ms_1k"] > 0
        assert got[workload]["others_cpu_ms_1k"] >= 0 and got[workload]["steal_ms_1k"] >= 0


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


def test_the_rocketmq_section_says_what_a_new_file_cost_before_each_system_when_the_run_read_it() -> None:
    batches = {"id": "wire_batch", "title": "batches", "kind": "rate", "notes": [],
               "systems": {OURS: {"msg_s": 2500, "n": 10, "seconds": 1},
                           ROCKETMQ: {"msg_s": 5000, "n": 10, "seconds": 1}}}  # fmt: skip
    results = _results([batches])
    assert not any("A new 1 KiB file cost" in line for line in rocketmq_section(results))
    results["extra"]["wire_file_create_us"] = {ROCKETMQ: 31.4, OURS: 812.0}
    [line] = [line for line in rocketmq_section(results) if "A new 1 KiB file cost" in line]
    assert f"before {ROCKETMQ} 31 us, before {OURS} 812 us of CPU" in line


def test_the_file_create_probe_measures_new_files_and_leaves_none(tmp_path: Path) -> None:
    cost = file_create_us(tmp_path, files=20)
    assert 0 < cost < 1_000_000  # microseconds of CPU, not seconds or nanoseconds
    assert list(tmp_path.iterdir()) == []


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


def test_a_scenario_s_system_properties_override_the_defaults_once_each(tmp_path: Path) -> None:
    cmd = java_command("cp.jar", tmp_path, "push", "--topic", "T",
                       properties={"rocketmq.client.logLevel": "INFO", "a.b": "c"})  # fmt: skip
    props = [a for a in cmd if a.startswith("-D")]
    assert "-Drocketmq.client.logLevel=INFO" in props and "-Da.b=c" in props
    assert not [a for a in props if a.startswith("-Drocketmq.client.logLevel=WARN")]
    assert f"-Duser.home={tmp_path}" in props
    assert cmd.index("-Da.b=c") < cmd.index("-cp") and cmd[-3:] == ["push", "--topic", "T"]
    assert "-Drocketmq.client.logLevel=WARN" in java_command("cp.jar", tmp_path, "push")


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
