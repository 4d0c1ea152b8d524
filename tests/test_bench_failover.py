"""The failover workload kills consumer processes and times their queues' takeover; the report judges
DESIGN.md §7's "a consumer dies" row on it."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import report
from bench.workloads import OURS, Context, Sizes
from bench.workloads.failover import KILLS, _Owners, failover


class _Events:
    def __init__(self, items: list[tuple[int, int, float]]) -> None:
        self.items = items

    def get(self, timeout: float) -> tuple[int, int, float]:
        import queue

        if not self.items:
            raise queue.Empty
        return self.items.pop(0)


def test_takeover_counts_only_other_consumers_after_the_kill() -> None:
    owners = _Owners(_Events([(1, 0, 9.0), (1, 0, 10.5), (2, 1, 10.2), (2, 0, 11.0), (3, 1, 12.0)]))
    # queue 0: worker 1 (the dead one) after the kill does not count; worker 2 at 11.0 does
    assert owners.taken_over({0, 1}, dead=1, killed_at=10.0, timeout_s=0.5) == pytest.approx({0: 1.0, 1: 0.2})


def test_a_run_kills_consumers_and_the_report_judges_the_row(tmp_path: Path) -> None:
    ctx = Context(Sizes.quick(), tmp_path, None, "no redis", lambda line: None)
    [result] = failover(ctx)
    ours = result["systems"][OURS]
    assert ours.get("n") == KILLS, ours
    assert ours["max_ms"] >= ours["p50_ms"] > 0
    [target] = [t for t in report.TARGETS if t.workload == "failover"]
    text, met = report.evaluate(target, {"failover": result})
    assert met is (ours["max_ms"] <= 5000), text
