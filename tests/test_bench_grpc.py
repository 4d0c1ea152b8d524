"""The gRPC benchmark's pure parts (issue 29's target): measures from the official Python client's run,
the section of BENCHMARKS.md stating lakemq's ratios to the RocketMQ 5 proxy (or to the Python API when
the proxy could not run), the RocketMQ 5 harness's command line, and the Python API peer on a real
store (no JVM, no timing assertion)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.java_harness import ROCKETMQ5_MAIN_CLASS, rocketmq5_command
from bench.report import grpc_section, render
from bench.workloads import OURS, PYTHON_API, ROCKETMQ5
from bench.workloads.grpc import WORKLOADS, measures, python_api


def client_output(**over: Any) -> dict[str, Any]:
    out = {
        "send_ms": [1.0, 2.0, 3.0, 10.0],
        "send_s": 2.0,
        "send_failures": 0,
        "received": 4,
        "receive_s": 0.5,
    }
    return {**out, **over}


def test_measures_turn_the_clients_run_into_a_send_latency_and_two_rates() -> None:
    got = measures(client_output())
    assert got["grpc_send"] == {"p50_ms": 2.0, "p99_ms": 10.0, "mean_ms": 4.0, "n": 4}
    assert got["grpc_send_rate"] == {"msg_s": 2, "n": 4, "seconds": 2.0}
    assert got["grpc_receive_ack"] == {"msg_s": 8, "n": 4, "seconds": 0.5}
    assert set(got) == {w[0] for w in WORKLOADS}


def test_measures_say_how_many_sends_failed_and_how_many_messages_never_came() -> None:
    got = measures(client_output(send_failures=2, received=3))
    assert got["grpc_send"]["failures"] == got["grpc_send_rate"]["failures"] == 2
    assert got["grpc_receive_ack"]["missing"] == 1


def test_a_run_where_no_send_succeeded_has_no_latency_instead_of_a_zero() -> None:
    got = measures(client_output(send_ms=[], received=0))
    assert "unavailable" in got["grpc_send"]


def _workloads(peer: str) -> list[dict[str, Any]]:
    send = {"id": "grpc_send", "title": "one send", "kind": "latency", "notes": [],
            "systems": {OURS: {"p50_ms": 6.0, "p99_ms": 20.0, "mean_ms": 7.0, "n": 5},
                        peer: {"p50_ms": 3.0, "p99_ms": 9.0, "mean_ms": 4.0, "n": 5}}}  # fmt: skip
    acks = {"id": "grpc_receive_ack", "title": "receive + ack", "kind": "rate", "notes": [],
            "systems": {OURS: {"msg_s": 300, "n": 10, "seconds": 1},
                        peer: {"msg_s": 400, "n": 10, "seconds": 1}}}  # fmt: skip
    return [send, acks]


def _results(workloads: list[dict[str, Any]], proxy: str = "5.3.3") -> dict[str, Any]:
    return {
        "command": "bash bench/run.sh --only grpc", "date": "2026-11-28 12:00 UTC", "mode": "full",
        "elapsed_s": 60,
        "machine": {"cpu_model": "cpu", "cores": 2, "ram_gib": 8, "platform": "linux",
                    "load_average_start": [0.1, 0.1, 0.1], "load_average_end": [0.2, 0.2, 0.2]},
        "versions": {}, "params": {}, "workloads": workloads, "extra": {"rocketmq5_proxy": proxy},
    }  # fmt: skip


def test_the_grpc_section_states_each_ratio_to_the_rocketmq_5_proxy() -> None:
    section = grpc_section(_results(_workloads(ROCKETMQ5)))
    assert section[0] == "## RocketMQ 5's gRPC door: the official Python client (issue 29)"
    assert "proxy 5.3.3" in section[2] and "**stated** (2 of 2)" in section[2]
    assert "| one send | p50 6.00 ms, p99 20.0 ms | p50 3.00 ms, p99 9.00 ms | 2.0x slower |" in section
    assert "| receive + ack | 300 msg/s | 400 msg/s | 75% |" in section
    assert "## RocketMQ 5's gRPC door" in render(_results(_workloads(ROCKETMQ5)))


def test_the_grpc_section_names_the_python_api_peer_and_why_the_proxy_did_not_run() -> None:
    section = grpc_section(_results(_workloads(PYTHON_API), proxy="not available (no Maven)"))
    assert "lakemq's own Python API" in section[2] and "no Maven" in section[2]
    assert f"| workload | lakemq (mq serve --grpc) | {PYTHON_API} | lakemq vs {PYTHON_API} |" in section


def test_an_unmeasured_peer_leaves_the_ratios_not_stated_and_no_grpc_workload_no_section() -> None:
    [send, acks] = _workloads(ROCKETMQ5)
    send["systems"][ROCKETMQ5] = {"unavailable": "RocketMQ 5 did not start"}
    section = grpc_section(_results([send, acks]))
    assert "**not measured** (1 of 2)" in section[2]
    assert "not available: RocketMQ 5 did not start" in section[6]
    assert grpc_section(_results([])) == []


def test_the_rocketmq5_harness_command_runs_its_main_with_the_logs_under_the_given_home(
    tmp_path: Path,
) -> None:
    cmd = rocketmq5_command("a.jar:b.jar", tmp_path, "simple", "--group", "g")
    assert cmd[cmd.index("-cp") + 1 :] == ["a.jar:b.jar", ROCKETMQ5_MAIN_CLASS, "simple", "--group", "g"]
    assert f"-Duser.home={tmp_path}" in cmd


def test_the_python_api_peer_sends_receives_and_acks_every_message(tmp_path: Path) -> None:
    got = python_api(tmp_path / "store", 5, 16)
    assert got["grpc_send"]["n"] == got["grpc_send_rate"]["n"] == got["grpc_receive_ack"]["n"] == 5
    assert "missing" not in got["grpc_receive_ack"]
