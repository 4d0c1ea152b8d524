"""The object-storage step of the benchmark (``--only s3``) in a tiny configuration, on the run's
SeaweedFS server: it runs end to end and reports every figure its targets read (no timing
assertions)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.report import TARGETS, evaluate, object_storage_section
from bench.run import STEPS
from bench.workloads import BARE, OURS, Context, Sizes
from bench.workloads import object_store as s3_workload

pytestmark = [pytest.mark.s3, pytest.mark.slow]

TINY = Sizes(
    s3_sync_sends=3,
    s3_batch_messages=50,
    s3_batches=1,
    s3_async_messages=160,  # 40 per queue: a pull of 32 fits
    s3_pulls=3,
    s3_ack_messages=40,
    s3_e2e_seconds=0,  # the broker's Spark start is covered by the flow and job tests
    s3_writers=2,
    s3_writer_sends=2,
)


def test_the_s3_step_is_part_of_the_full_run() -> None:
    assert ("s3", s3_workload.object_store, False) in STEPS


def test_tiny_s3_run_reports_both_profiles_in_requests_and_round_trips(
    s3_server: Any, s3_bucket: str, tmp_path: Path
) -> None:
    ctx = Context(TINY, tmp_path, None, "no redis", lambda _: None)
    results = s3_workload.on_server(s3_server, s3_bucket, ctx)
    by_id = {r["id"]: r for r in results}
    expected = {
        s3_workload.workload_id(profile, what)
        for profile, _ in s3_workload.PROFILES
        for what, _ in s3_workload.WHATS
    }
    assert set(by_id) == expected and len(results) == len(expected)
    for profile, delay_ms in s3_workload.PROFILES:
        sync = by_id[s3_workload.workload_id(profile, "send_sync")]["systems"]
        for system in (OURS, BARE):
            assert sync[system]["n"] == TINY.s3_sync_sends, (profile, system, sync[system])
            assert sync[system]["requests_per_op"] >= 1  # a commit is at least one PUT
            assert ("p50_rtts" in sync[system]) is (delay_ms > 0)
            # the round trip is measured: the injected delay and the server's own time
            assert sync[system].get("rtt_ms", 0) >= delay_ms
        batch = by_id[s3_workload.workload_id(profile, "produce_batched")]["systems"]
        assert batch[OURS]["n"] == batch[BARE]["n"] == TINY.s3_batch_messages
    e2e = by_id[s3_workload.workload_id(s3_workload.INJECTED, "end_to_end")]["systems"][OURS]
    assert e2e == {"unavailable": "not run (s3_e2e_seconds is 0)"}
    for what in ("writers_1", f"writers_{s3_workload.SHARDS}"):
        measure = by_id[s3_workload.workload_id(s3_workload.INJECTED, what)]["systems"][OURS]
        assert "gave_up" in measure or measure["unavailable"], measure
    for target in TARGETS:
        if (target.workload or "").startswith("s3_"):
            assert "did not run" not in evaluate(target, by_id)[0], target.label
    section = object_storage_section({"workloads": results})
    assert section[0] == "## Object storage"
    assert len([line for line in section if line.startswith("| ")]) == 1 + len(s3_workload.WHATS)
