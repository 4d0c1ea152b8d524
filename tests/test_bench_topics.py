"""The topics and SYNC_FLUSH workloads of the benchmark: their targets and a tiny run (no timing)."""

from __future__ import annotations

from pathlib import Path

from bench.report import TARGETS, Condition, Target, evaluate
from bench.workloads import OURS, Context, Sizes
from bench.workloads import topics as topics_workload


def test_a_factor_target_reads_the_factor_the_workload_computed() -> None:
    target = Target("t", "w", (Condition("x_send", "<=", 3),))
    within = {"w": {"id": "w", "kind": "latency", "systems": {OURS: {"p50_ms": 9.0, "x_send": 2.5}}}}
    beyond = {"w": {"id": "w", "kind": "latency", "systems": {OURS: {"p50_ms": 9.0, "x_send": 3.5}}}}
    assert evaluate(target, within) == ("2.50x send", True)
    assert evaluate(target, beyond) == ("3.50x send", False)


def test_a_size_target_reads_bytes() -> None:
    target = Target("t", "w", (Condition("commit_bytes", "<=", 4096),))
    workloads = {"w": {"id": "w", "kind": "latency", "systems": {OURS: {"commit_bytes": 5000, "n": 3}}}}
    assert evaluate(target, workloads) == ("5,000 B", False)


def test_tiny_topics_and_flush_runs_produce_every_figure_their_targets_read(tmp_path: Path) -> None:
    sizes = Sizes(sync_sends=3, topics_many=30, topic_creates=3)
    ctx = Context(sizes, tmp_path, None, "no redis", lambda _: None)
    results = topics_workload.topics(ctx) + topics_workload.sync_flush(ctx)
    by_id = {r["id"]: r for r in results}
    assert sorted(by_id) == ["commit_metadata", "send_many_topics", "send_sync_flush", "topic_create"]
    mine = [t for t in TARGETS if t.workload in by_id]
    assert len(mine) == 3  # SYNC_FLUSH has no §7 target: measured, not judged
    for target in mine:
        measured, met = evaluate(target, by_id)
        assert met is not None, (target.label, measured)
    assert by_id["commit_metadata"]["systems"][OURS]["commit_bytes"] <= 4096
    assert by_id["send_sync_flush"]["systems"][OURS]["n"] == 3
