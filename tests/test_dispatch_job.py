"""The dispatch job (jobs/dispatch.py): commit_log -> consume_queue, triggered by Spark, exactly once."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from engine import Message, Producer, PullConsumer, PullStatus, SendResult, Store, SysFlag
from engine.spark.jobs.dispatch import DispatchStats, run_dispatch
from engine.spark.jobs.streams import checkpoint_location
from engine.spark.progress import query_status
from engine.store import schemas
from engine.store.commit_log import CommitLogWriter
from engine.store.commit_log.stamping import PendingMessage
from engine.store.consume_queue import dispatched_version
from jobs.dispatch import main


def _send(store: Store, topic: str, n: int, start: int = 0) -> list[SendResult]:
    with Producer(store) as p:
        return p.send_batch([Message(topic, f"m{start + i}".encode(), tags="A") for i in range(n)])


def _pulled(store: Store, topic: str, queues: int = 4) -> dict[int, list[tuple[int, bytes]]]:
    """Every dispatched message of a topic: queue -> [(queue offset, body)]."""
    consumer = PullConsumer(store, "g")
    out: dict[int, list[tuple[int, bytes]]] = {}
    for q in range(queues):
        offset, got = 0, []
        while True:
            r = consumer.pull(topic, q, offset, max_nums=1024)
            if r.status is not PullStatus.FOUND:
                break
            got += [(m.queue_offset, m.body) for m in r.messages]
            offset = r.next_begin_offset
        out[q] = got
    return out


def _consume_queue(store: Store) -> list[dict[str, Any]]:
    rows = store.read(schemas.CONSUME_QUEUE).to_pylist()
    return sorted(rows, key=lambda r: (r["topic"], r["queue_id"], r["queue_offset"]))


def _assert_exactly_once(store: Store, topic: str, sent: list[SendResult]) -> None:
    pulled = _pulled(store, topic)
    for q, entries in pulled.items():
        assert [off for off, _ in entries] == list(range(len(entries))), f"queue {q} offsets not dense"
    bodies = sorted(body for entries in pulled.values() for _, body in entries)
    assert bodies == sorted(f"m{i}".encode() for i in range(len(sent)))


@pytest.mark.spark
def test_dispatch_once_makes_sent_messages_pullable_and_a_second_run_adds_nothing(
    spark: Any, store: Store, topic: str
) -> None:
    sent = _send(store, topic, 8)
    stats = DispatchStats()
    query = run_dispatch(spark, store, once=True, stats=stats)
    assert not query.isActive and query.exception() is None
    assert stats.entries == 8
    for s in sent:
        r = PullConsumer(store, "g").pull(topic, s.queue_id, s.queue_offset, max_nums=1)
        assert r.status is PullStatus.FOUND
        m = r.messages[0]
        assert (m.offset_msg_id, m.queue_offset, m.physical_offset) == (
            s.offset_msg_id,
            s.queue_offset,
            s.physical_offset,
        )
    assert dispatched_version(store) == store.version(schemas.COMMIT_LOG)
    # Spark does not read the rows, yet the query's progress counts them (for progress lines and status).
    status = query_status("dispatch", query, state="finished", store=store, source_table=schemas.COMMIT_LOG)
    assert (status.num_input_rows, status.total_input_rows, status.batches) == (8, 8, 1)
    assert status.end_to_end_delay_ms is not None

    before_rows, before_version = _consume_queue(store), store.version(schemas.CONSUME_QUEUE)
    again = DispatchStats()
    run_dispatch(spark, store, once=True, stats=again)
    # A new start (the version after the marker) has its own checkpoint: at most one micro-batch of
    # the head version, which the marker already covers.
    assert again.batches <= 1 and again.entries == 0
    assert store.version(schemas.CONSUME_QUEUE) == before_version
    assert _consume_queue(store) == before_rows


@pytest.mark.spark
def test_restart_with_same_and_fresh_checkpoint_dispatches_every_message_once(
    spark: Any, store: Store, topic: str, tmp_path: Path
) -> None:
    sent = _send(store, topic, 5)
    run_dispatch(spark, store, once=True)
    sent += _send(store, topic, 7, start=5)
    run_dispatch(spark, store, once=True)  # same (default) checkpoint
    _assert_exactly_once(store, topic, sent)
    sent += _send(store, topic, 3, start=12)
    stats = DispatchStats()
    run_dispatch(spark, store, once=True, checkpoint=str(tmp_path / "fresh"), stats=stats)
    assert stats.entries == 3  # resumed from the consume queue's marker, not from version 0
    _assert_exactly_once(store, topic, sent)
    assert len(_consume_queue(store)) == 15


@pytest.mark.spark
def test_replaying_the_whole_log_adds_nothing(
    spark: Any, store: Store, topic: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent = _send(store, topic, 4)
    run_dispatch(spark, store, once=True)
    before = _consume_queue(store)
    # A fresh checkpoint that starts from version 0: every micro-batch is a replay.
    from engine.broker import dispatch as decisions
    from engine.spark.jobs import dispatch as job

    monkeypatch.setattr(job, "dispatched_version", lambda s, shard=0: -1)  # where the stream starts
    monkeypatch.setattr(decisions, "_dispatched", lambda s, shard: -1)  # what each batch reads
    run_dispatch(spark, store, once=True, checkpoint=str(tmp_path / "replay"))
    monkeypatch.undo()
    assert _consume_queue(store) == before
    _assert_exactly_once(store, topic, sent)


@pytest.mark.spark
def test_a_checkpoint_ahead_of_the_consume_queue_is_caught_up(
    spark: Any, store: Store, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from engine.broker import dispatch as decisions

    sent = _send(store, topic, 3)
    # A run whose batch "succeeded" without writing: the checkpoint moves past versions the
    # consume queue does not have (as with a checkpoint copied from elsewhere).
    monkeypatch.setattr(decisions, "dispatch_rows", lambda store, rows: 0)
    run_dispatch(spark, store, once=True)
    monkeypatch.undo()
    assert dispatched_version(store) == -1
    sent += _send(store, topic, 2, start=3)
    run_dispatch(spark, store, once=True)
    _assert_exactly_once(store, topic, sent)


@pytest.mark.spark
def test_transaction_halves_are_never_dispatched(spark: Any, store: Store, topic: str) -> None:
    writer = CommitLogWriter(store)
    writer.append(
        [
            PendingMessage(topic, 0, b"half", "U-HALF", sys_flag=int(SysFlag.PREPARED)),
            PendingMessage(topic, 0, b"rolled-back", "U-RB", sys_flag=int(SysFlag.ROLLBACK)),
        ]
    )
    sent = _send(store, topic, 2)
    writer.append([PendingMessage(topic, 1, b"half2", "U-HALF2", sys_flag=int(SysFlag.PREPARED))])
    run_dispatch(spark, store, once=True)
    entries = _consume_queue(store)
    assert sorted(e["physical_offset"] for e in entries) == sorted(s.physical_offset for s in sent)
    bodies = [body for q in _pulled(store, topic).values() for _, body in q]
    assert sorted(bodies) == [b"m0", b"m1"]
    assert dispatched_version(store) == store.version(schemas.COMMIT_LOG)


@pytest.mark.spark
def test_continuous_run_picks_up_new_messages_and_stops_cleanly(spark: Any, store: Store, topic: str) -> None:
    stats = DispatchStats()
    query = run_dispatch(spark, store, once=False, stats=stats)
    try:
        assert query.isActive
        sent = _send(store, topic, 1)[0]
        deadline = time.monotonic() + 30
        while dispatched_version(store) < store.version(schemas.COMMIT_LOG):
            assert time.monotonic() < deadline, "the running dispatch job never dispatched the message"
            time.sleep(0.1)
        assert [e["physical_offset"] for e in _consume_queue(store)] == [sent.physical_offset]
    finally:
        query.stop()
    assert not query.isActive and query.exception() is None
    assert stats.entries == 1


@pytest.mark.spark
def test_main_runs_until_its_query_stops_and_prints_a_summary(
    spark: Any, store: Store, topic: str, capsys: pytest.CaptureFixture[str]
) -> None:
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(main(["--store", store.root])), daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not [q for q in spark.streams.active if q.name == f"lakemq-dispatch-{store.store_id}"]:
        assert time.monotonic() < deadline and thread.is_alive(), "main never started its query"
        time.sleep(0.1)
    sent = _send(store, topic, 2)
    while len(_consume_queue(store)) < 2:
        assert time.monotonic() < deadline, "main's query never dispatched"
        time.sleep(0.1)
    for q in spark.streams.active:
        if q.name == f"lakemq-dispatch-{store.store_id}":
            q.stop()
    thread.join(30)
    assert codes == [0]
    assert "dispatch: 2 entries dispatched" in capsys.readouterr().out
    _assert_exactly_once(store, topic, sent)
    assert spark.range(1).count() == 1  # main left the shared session running


@pytest.mark.spark
def test_main_once_prints_summary(
    spark: Any, store: Store, topic: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _send(store, topic, 3)
    assert main(["--store", store.root, "--once"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("dispatch: 3 entries dispatched")
    assert Path(checkpoint_location(store, "dispatch")).is_dir()


@pytest.mark.parametrize("bad", ["file", "unwritable"])
def test_main_with_a_bad_store_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], bad: str
) -> None:
    if bad == "file":
        path = tmp_path / "f"
        path.write_text("x")
    else:
        path = Path("/proc/lakemq-no-such-store")
    assert main(["--store", str(path), "--once"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("jobs/dispatch.py: error:")


def test_main_with_an_unknown_option_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--no-such-option"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["jobs/dispatch.py: error: unrecognized arguments: --no-such-option"]


def test_checkpoint_location_defaults_under_the_store(store: Store) -> None:
    assert checkpoint_location(store, "dispatch") == f"{store.root}/_checkpoints/dispatch"
    assert checkpoint_location(store, "dispatch", "/x/cp") == "/x/cp"
    moved = Store(store.root, None, store.config.replace(checkpoint_dir="/elsewhere/"))
    assert checkpoint_location(moved, "dispatch") == "/elsewhere/dispatch"


@pytest.mark.spark
def test_the_query_follows_the_commit_log_through_delta_or_deltalog(
    spark_reads: Any, store: Store, topic: str
) -> None:
    from engine.spark.jobs.dispatch import commit_log_trigger
    from engine.spark.session import delta_enabled

    trigger = commit_log_trigger(spark_reads, store, lambda shard: 0, 200)
    assert trigger.frame.isStreaming and len(trigger.frame.columns) == 1  # only a trigger: one column
    if delta_enabled(spark_reads):
        assert (trigger.source, trigger.checkpoint_subdir, trigger.starts) == ("delta", "delta/from-0", (0,))
        critical = commit_log_trigger(spark_reads, store, lambda shard: 0, 200, latency_critical=True)
        assert (critical.source, critical.checkpoint_subdir) == ("deltalog", None)  # dispatch's
    else:
        assert (trigger.source, trigger.checkpoint_subdir) == ("deltalog", None)
        assert trigger.frame.columns == ["_version"]


def test_dispatch_committed_resumes_at_the_marker_in_bounded_commits(store: Store, topic: str) -> None:
    from engine.broker.dispatch import dispatch_committed

    sent = [r for i in range(5) for r in _send(store, topic, 1, start=i)]  # five commit-log versions
    cq_before = store.version(schemas.CONSUME_QUEUE)
    assert dispatch_committed(store, max_versions=2) == (5, 5)
    assert store.version(schemas.CONSUME_QUEUE) == cq_before + 3  # versions 2 + 2 + 1
    assert dispatched_version(store) == store.version(schemas.COMMIT_LOG)
    _assert_exactly_once(store, topic, sent)

    sent += _send(store, topic, 2, start=5)
    assert dispatch_committed(store) == (2, 2)  # only what came after the marker
    version = store.version(schemas.CONSUME_QUEUE)
    assert dispatch_committed(store) == (0, 0)
    assert store.version(schemas.CONSUME_QUEUE) == version
    _assert_exactly_once(store, topic, sent)
