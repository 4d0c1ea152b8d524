"""The soak's bookkeeping: message accounting, growth verdicts, the report section it keeps."""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from pathlib import Path

import pyarrow as pa
from deltalake import write_deltalake

from bench import report, soak, soak_workers


def test_body_encoding_carries_producer_sequence_and_send_time():
    body = soak_workers.encode(3, 17, 64)
    seq, sent_ms = soak_workers.decode(body)
    assert len(body) == 64
    assert seq >> soak_workers.SEQ_SHIFT == 3 and seq & ((1 << soak_workers.SEQ_SHIFT) - 1) == 17
    assert sent_ms > 1.6e12  # epoch milliseconds, not a monotonic clock


def test_accounting_counts_lost_and_duplicated_messages_per_group():
    finals = [
        {"role": "producer", "final": True, "sent": [1, 2, 3], "failed": 1},
        {"role": "producer", "final": True, "sent": [4], "failed": 0},
        {"role": "pull", "final": True, "received": [1, 2, 3, 4]},
        {"role": "simple", "final": True, "received": [1, 1, 2]},
        {"role": "simple", "final": True, "received": [4]},
    ]
    acc = soak.account(finals)
    assert acc["sent"] == 4 and acc["failed_sends"] == 1
    assert acc["pull"] == {"received": 4, "lost": 0, "duplicates": 0, "finals": 1}
    assert acc["simple"] == {"received": 4, "lost": 1, "duplicates": 1, "finals": 2}


def test_a_series_grows_only_past_the_ratio_and_the_floor():
    flat = [100.0, 101, 99, 100, 102, 98, 100, 101]
    assert soak.judge(flat, 10)["grows"] is False
    rising = [10.0, 12, 20, 40, 60, 80, 100, 120]
    verdict = soak.judge(rising, 10)
    assert verdict["grows"] is True and verdict["first"] == 11.0 and verdict["last"] == 110.0
    assert soak.judge([1.0, 1, 2, 3, 4, 5, 6, 8], 20)["grows"] is False  # tripled, but under the floor
    assert soak.judge([1.0, None, 2], 0)["grows"] is None  # too few samples to judge


def test_verdicts_pool_each_roles_p99_and_judge_memory_and_tables():
    windows = [
        soak_workers.window("producer", "p0", 10, {"send_ms": [5.0, 6.0]}),
        soak_workers.window("producer", "p0", 10, {"send_ms": []}),
        soak_workers.window("pull", "c0", 5, {"pull_ms": [1.0], "e2e_ms": [50.0]}),
    ]
    samples = [
        {
            "rss_mib": {"broker": 500.0 + i},
            "tables": {
                "commit_log": {"live_files": 5, "data_files": 10 + 9 * i, "log_files": 10 + i, "log_mib": 0.1}
            },
        }
        for i in range(8)
    ]
    out = soak.verdicts(windows, samples)
    assert out["producer send_ms p99"]["grows"] is None  # one window with samples: not judged
    assert out["rss broker MiB"]["grows"] is False
    assert out["commit_log log_files"]["first"] == 10.5
    assert set(out) >= {"pull pull_ms p99", "pull e2e_ms p99", "commit_log live_files", "commit_log log_mib"}
    assert "commit_log data_files" not in out  # files on disk wait for vacuum's window: not judged


def test_verdicts_leave_out_the_warm_up():
    # A log that fills up to its bound in the first 10 minutes, then stays there.
    samples = [
        {
            "t": 60.0 * m,
            "rss_mib": {},
            "tables": {"t": {"live_files": 5, "log_files": min(m, 10) * 100, "log_mib": 0}},
        }
        for m in range(21)
    ]
    assert soak.verdicts([], samples)["t log_files"]["grows"] is True
    settled = soak.verdicts([], samples, warmup_s=600.0)["t log_files"]
    assert settled["grows"] is False and settled["first"] == 1000
    assert soak.warmup_minutes(5) == 10.0


def test_table_sizes_count_data_files_and_log_files(tmp_path: Path):
    write_deltalake(str(tmp_path / "t"), pa.table({"x": [1]}))
    write_deltalake(str(tmp_path / "t"), pa.table({"x": [2]}), mode="append")
    (tmp_path / "not_a_table").mkdir()
    sizes = soak.table_sizes(tmp_path)
    assert list(sizes) == ["t"]
    assert sizes["t"]["data_files"] == 2 and sizes["t"]["log_files"] == 2 and sizes["t"]["log_mib"] > 0
    assert sizes["t"]["live_files"] == 2
    write_deltalake(str(tmp_path / "t"), pa.table({"x": [3]}), mode="overwrite")
    again = soak.table_sizes(tmp_path)["t"]
    assert again["live_files"] == 1 and again["data_files"] == 3  # the removed files wait for vacuum


def test_rss_counts_a_process_and_its_children():
    ctx = mp.get_context("spawn")
    child = ctx.Process(target=_sleep)
    child.start()
    try:
        alone = soak.rss_mib(child.pid or 0)
        with_child = soak.rss_mib(os.getpid())
        assert alone > 1 and with_child > alone
    finally:
        child.kill()
        child.join()


def _sleep() -> None:
    time.sleep(30)


def _fail() -> None:
    raise SystemExit(3)


def test_workers_that_failed_while_draining_are_reported_and_the_rest_stopped():
    ctx = mp.get_context("spawn")
    procs = {
        "c0": ctx.Process(target=_fail),
        "p0": ctx.Process(target=_sleep),
        "s0": ctx.Process(target=time.time),
    }
    for proc in procs.values():
        proc.start()
    procs["c0"].join(60)
    procs["s0"].join(60)
    exits: dict[str, int | None] = {"p1": 1}  # died during the soak itself: kept as it was
    soak.stop_workers(procs, exits)
    procs["p0"].join(60)
    assert exits == {"p1": 1, "c0": 3}  # the killed one and the clean exit are not failures
    assert not procs["p0"].is_alive()


def test_a_soak_replaces_only_its_own_section_and_a_benchmark_run_keeps_it():
    first = report.with_soak("# Benchmarks\n\nfigures\n", "soak one")
    again = report.with_soak(first, "soak two")
    assert again.count(report.SOAK_START) == 1 and "soak one" not in again and "figures" in again
    rerun = report.with_soak("# Benchmarks\n\nnew figures\n", report.soak_of(again))
    assert "new figures" in rerun and report.soak_of(rerun) == "soak two"
    assert report.soak_of("# Benchmarks\n") is None
    assert report.with_soak("# B\n", None) == "# B\n"


def _results(drain_cut: bool) -> dict[str, object]:
    finals = [
        {"role": "producer", "final": True, "sent": [1, 2, 3], "failed": 0},
        {"role": "pull", "final": True, "received": [1, 2, 3]},
        {"role": "simple", "final": True, "received": [1]},
    ]
    params = {"minutes": 1, "producers": 1, "rate": 1.0, "body_bytes": 8, "pullers": 1, "simple": 1}
    return {
        "date": "today",
        "params": {**params, "window": 30.0, "log_retention_minutes": 2},
        "warmup_minutes": 0,
        "samples": [],
        "accounting": soak.account(finals),
        "early_exits": {},
        "drain_cut": drain_cut,
        "verdicts": {},
    }


def test_a_drain_cut_at_its_deadline_reports_the_backlog_as_not_received_rather_than_lost():
    cut = soak.markdown(_results(True))
    assert "simple group received 1, not received (backlog) 2" in cut and "were told to stop" in cut
    whole = soak.markdown(_results(False))
    assert "simple group received 1, lost 2" in whole and "told to stop" not in whole


def test_a_consumer_told_to_quit_stops_and_reports_what_it_received(tmp_path: Path):
    from engine import Admin, Store

    store = Store.open(tmp_path / "store")
    Admin(store).create_topic("Soak", 2)
    ctx = mp.get_context("spawn")
    stop, drained, quit, out = ctx.Event(), ctx.Event(), ctx.Event(), ctx.Queue()
    proc = ctx.Process(
        target=soak_workers.pull_consumer,
        args=(str(tmp_path / "store"), "Soak", 0, [0, 1], 30.0, stop, drained, quit, out),
    )
    proc.start()
    try:
        quit.set()  # neither stopped nor drained: only quit ends it
        final = out.get(timeout=120)
        while not final.get("final"):
            final = out.get(timeout=120)
        proc.join(60)
        assert final["received"] == [] and proc.exitcode == 0
    finally:
        if proc.is_alive():
            proc.kill()
