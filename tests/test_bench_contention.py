"""The contention workload of the benchmark: its targets, and a tiny run of spawned writers (no
timing assertions)."""

from __future__ import annotations

from pathlib import Path

from bench.report import TARGETS, evaluate
from bench.run import STEPS
from bench.workloads import OURS, Context, Sizes
from bench.workloads import contention as contention_workload


def test_none_gives_up_is_met_only_when_nobody_gave_up() -> None:
    wid = "s3_rtt20_writers_1"
    target = next(t for t in TARGETS if t.workload == wid)

    def workloads(gave_up: int) -> dict[str, dict[str, object]]:
        measure = {"msg_s": 10, "n": 80, "seconds": 8.0, "gave_up": gave_up, "failures": 0}
        return {wid: {"id": wid, "kind": "rate", "systems": {OURS: measure}}}

    assert evaluate(target, workloads(0)) == ("0 gave up, 0 failed", True)
    assert evaluate(target, workloads(3)) == ("3 gave up, 0 failed", False)


def test_the_shards_target_is_not_measured_without_a_sharded_run() -> None:
    target = next(t for t in TARGETS if t.workload == "s3_rtt20_writers_4")
    assert evaluate(target, {}) == ("not measured: the `s3_rtt20_writers_4` workload did not run", None)


def test_contention_is_a_step_of_the_benchmark() -> None:
    assert ("contention", contention_workload.contention, False) in STEPS


def test_tiny_contention_run_reports_every_figure_its_targets_read(tmp_path: Path) -> None:
    sizes = Sizes(contention_writers=2, contention_sends=3)
    ctx = Context(sizes, tmp_path, None, "no redis", lambda _: None)
    by_id = {r["id"]: r for r in contention_workload.contention(ctx)}
    expected = {"contention_1", "contention_racing", "contention_queued", "contention_shards"}
    assert set(by_id) == expected
    racing = by_id["contention_racing"]["systems"][OURS]
    assert (racing["writers"], racing["lock"], racing["shards"], racing["n"]) == (2, False, 1, 6)
    assert racing["gave_up"] == 0
    assert racing["p50_ms"] <= racing["p99_ms"] <= racing["max_ms"]
    assert by_id["contention_queued"]["systems"][OURS]["lock"] is True
    sharded = by_id["contention_shards"]["systems"][OURS]
    assert (sharded["shards"], sharded["lock"], sharded["gave_up"]) == (4, False, 0)
    for target in (t for t in TARGETS if t.workload in by_id):
        assert evaluate(target, by_id)[1] is not None, target.label
    assert list(tmp_path.iterdir()) == []  # every run's store removed


def test_collect_raises_when_a_writer_reports_an_error_or_dies_instead_of_waiting() -> None:
    import queue
    from types import SimpleNamespace

    import pytest

    from bench.workloads.contention import _collect

    alive, dead = SimpleNamespace(exitcode=None), SimpleNamespace(exitcode=1)
    box: queue.Queue[object] = queue.Queue()
    for item in (0, 1):
        box.put(item)
    assert _collect(box, [alive, alive], 2, 5) == [0, 1]
    box.put("writer 1: StoreError: no bucket")
    with pytest.raises(RuntimeError, match="writer 1: StoreError: no bucket"):
        _collect(box, [alive], 1, 5)
    with pytest.raises(RuntimeError, match=r"1 writer process\(es\) died \(exit code 1\)"):
        _collect(box, [alive, dead], 1, 60)
    with pytest.raises(RuntimeError, match="took over 0 s"):
        _collect(box, [alive], 1, 0)
