"""What triggers the broker jobs that follow a table (dispatch, index, pull log, retry): Delta's
streaming source where Delta on Spark is on, the project's ``deltalog`` source where it is off, and
in both cases the job's own marker, not the stream's checkpoint, says where it resumes: a job
stopped mid-stream and started again, across compaction, retention and vacuum, dispatches and
indexes every message exactly once."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from engine import Admin, Message, Producer, PullConsumer, SendResult, Store
from engine.broker.maintenance import maintain
from engine.spark.jobs.dispatch import DispatchStats, run_dispatch
from engine.spark.jobs.index import IndexStats, run_index
from engine.spark.jobs.pull_log import PullLogStats, run_pull_log
from engine.spark.jobs.retry import RetryStats, run_retry
from engine.spark.jobs.streams import checkpoint_location, run_log_job
from engine.spark.progress import end_version
from engine.spark.session import DELTA_READS
from engine.store import schemas
from engine.store.consume_queue import dispatched_version
from engine.store.delta.log import earliest_version
from engine.store.index import indexed_version
from tests.helpers import age_and_clean_log

pytestmark = pytest.mark.spark

HOUR_MS = 3_600_000


def _send(store: Store, topic: str, n: int, start: int = 0) -> list[SendResult]:
    """``n`` messages, one commit each (so each is its own commit-log version and file)."""
    with Producer(store) as p:
        return [p.send(Message(topic, f"m{start + i}".encode(), keys=(f"k{start + i}",))) for i in range(n)]


def _source(query: Any) -> str:
    progress = query.lastProgress
    assert progress is not None, "the query ran no micro-batch"
    return str(progress["sources"][0]["description"])


def _consume_queue(store: Store, topic: str) -> dict[int, list[int]]:
    """queue id -> its consume-queue offsets, sorted."""
    out: dict[int, list[int]] = {}
    for row in store.read(schemas.CONSUME_QUEUE).to_pylist():
        if row["topic"] == topic:
            out.setdefault(row["queue_id"], []).append(row["queue_offset"])
    return {q: sorted(offsets) for q, offsets in out.items()}


def _assert_dispatched_once(store: Store, topic: str, sent: list[SendResult], removed: set[str]) -> None:
    """Every sent message not removed by retention has exactly one consume-queue entry, and each
    queue's entries are dense from where retention left them."""
    entries = _consume_queue(store, topic)
    for q, offsets in entries.items():
        assert offsets == list(range(offsets[0], offsets[0] + len(offsets))), f"queue {q}: {offsets}"
    expected = sorted((s.queue_id, s.queue_offset) for s in sent if s.offset_msg_id not in removed)
    got = sorted((q, o) for q, offsets in entries.items() for o in offsets)
    assert got == expected
    assert dispatched_version(store) == store.version(schemas.COMMIT_LOG)


def _index_counts(store: Store) -> dict[str, int]:
    counts: dict[str, int] = {}
    for row in store.read(schemas.INDEX).to_pylist():
        key = f"{row['topic']}:{row['kind']}:{row['key']}"
        counts[key] = counts.get(key, 0) + 1
    return counts


def test_every_job_following_a_table_but_dispatch_runs_on_deltas_source_when_delta_is_on(
    spark_reads: Any, store: Store, topic: str, request: pytest.FixtureRequest
) -> None:
    reads = request.node.callspec.params["spark_reads"]
    sent = _send(store, topic, 2)
    consumer = PullConsumer(store, "G")
    consumer.pull(topic, sent[0].queue_id, 0)  # an action-log row for pull_log and retry to follow
    queries = {
        "dispatch": run_dispatch(spark_reads, store, once=True, stats=DispatchStats()),
        "index": run_index(spark_reads, store, once=True, stats=IndexStats()),
        "pull_log": run_pull_log(spark_reads, store, once=True, stats=PullLogStats()),
        "retry": run_retry(spark_reads, store, once=True, stats=RetryStats()),
    }
    # Spark reads no row (the driver reads the versions), yet the progress counts them.
    assert sum(p["numInputRows"] for p in queries["index"].recentProgress) == 2
    for job, query in queries.items():
        assert query.exception() is None, job
        description = _source(query)
        if reads == "delta" and job != "dispatch":
            assert description.startswith("DeltaSource"), (job, description)
        else:  # dispatch is latency-critical: deltalog's trigger is faster (see table_trigger)
            assert "PythonMicroBatchStream" in description, (job, description)  # deltalog


def test_a_checkpoint_written_by_one_source_never_reaches_the_other(
    spark: Any, store: Store, topic: str
) -> None:
    from engine.spark.session import delta_enabled

    if not delta_enabled(spark):
        pytest.skip("Delta on Spark is off: the Delta jars could not be fetched")
    _send(store, topic, 3)
    spark.conf.set(DELTA_READS, "false")
    try:
        run_index(spark, store, once=True)  # deltalog's offsets in the job's checkpoint
    finally:
        spark.conf.set(DELTA_READS, "true")
    _send(store, topic, 2, start=3)
    stats = IndexStats()
    query = run_index(spark, store, once=True, stats=stats)  # same checkpoint, Delta's source
    assert query.exception() is None and stats.rows == 2
    location = Path(checkpoint_location(store, "index"))
    assert (location / "offsets").is_dir() and len(list((location / "delta").glob("from-*/offsets"))) == 1
    _send(store, topic, 1, start=5)
    spark.conf.set(DELTA_READS, "false")
    try:
        back = IndexStats()
        run_index(spark, store, once=True, stats=back)  # and back: deltalog's own offsets again
    finally:
        spark.conf.set(DELTA_READS, "true")
    assert back.rows == 1
    counts = _index_counts(store)
    assert all(f"{topic}:KEY:k{i}" in counts for i in range(6)) and set(counts.values()) == {1}
    assert indexed_version(store) == store.version(schemas.COMMIT_LOG)


def test_a_job_stopped_while_writing_its_first_offsets_starts_again(
    spark_reads: Any, store: Store, topic: str
) -> None:
    # Stopped between Spark's temporary offsets file and its rename (the index job of the test below
    # was, once): Spark then refuses the checkpoint ("should be empty on batch 0").
    _send(store, topic, 3)
    location = Path(checkpoint_location(store, "index"))
    for offsets in (location / "offsets", location / "delta" / "from-0" / "offsets"):
        offsets.mkdir(parents=True)
        (offsets / ".0.70090e71-2079-4552-9998-7352c6bbe2ce.tmp").write_bytes(b"")
        (offsets / "..0.70090e71-2079-4552-9998-7352c6bbe2ce.tmp.crc").write_bytes(b"")
    stats = IndexStats()
    query = run_index(spark_reads, store, once=True, stats=stats)
    assert query.exception() is None and stats.rows == 3
    assert indexed_version(store) == store.version(schemas.COMMIT_LOG)


def test_a_job_stopped_mid_stream_resumes_across_compaction_retention_and_vacuum(
    spark_reads: Any, store: Store, topic: str
) -> None:
    spark = spark_reads
    sent = _send(store, topic, 12)
    dispatch = run_dispatch(spark, store, once=False)
    index = run_index(spark, store, once=False, trigger_ms=100)
    more: list[SendResult] = []
    sender = threading.Thread(target=lambda: more.extend(_send(store, topic, 12, start=12)))
    sender.start()
    while dispatched_version(store) < 0 and dispatch.isActive:  # stopped while messages still arrive
        time.sleep(0.05)
    dispatch.stop()
    index.stop()
    sender.join()
    sent += more
    assert dispatch.exception() is None and index.exception() is None

    # Between the two runs: the group consumed what the first run dispatched of queues 0 and 1,
    # and a maintenance pass (far in the future: every file is old) removes it, compacts the rest,
    # writes checkpoints and vacuums.
    # The index resumes first: a job that lags behind retention and vacuum cannot read the data files
    # they deleted (StoreError "vacuumed before this reader got to it"), whatever triggers it.
    resumed = IndexStats()
    run_index(spark, store, once=True, stats=resumed)
    assert resumed.rows > 0 or indexed_version(store) == store.version(schemas.COMMIT_LOG)
    first_run = _consume_queue(store, topic)
    dispatched_before = sum(len(offsets) for offsets in first_run.values())
    consumer = PullConsumer(store, "g")
    for q in range(4):
        consumer.commit_offset(topic, q, len(first_run.get(q, [])) if q in (0, 1) else 0)
    removed = {
        s.offset_msg_id
        for s in sent
        if s.queue_id in (0, 1) and s.queue_offset < len(first_run.get(s.queue_id, []))
    }
    future = int(time.time() * 1000) + 10 * HOUR_MS
    report = maintain(store, file_reserved_hours=1, vacuum_retention_hours=0, min_files=2, now_ms=future)
    assert not report.errors and report.retention is not None
    assert report.retention["rows_removed"] == len(removed)
    assert any(c["version"] is not None for c in report.compaction.values())
    sent += _send(store, topic, 6, start=24)

    dispatch_stats, index_stats = DispatchStats(), IndexStats()
    again = run_dispatch(spark, store, once=True, stats=dispatch_stats)
    run_index(spark, store, once=True, stats=index_stats)
    assert again.exception() is None
    assert dispatch_stats.entries == len(sent) - dispatched_before  # the rest, nothing again
    _assert_dispatched_once(store, topic, sent, removed)
    assert indexed_version(store) == store.version(schemas.COMMIT_LOG)
    counts = _index_counts(store)
    assert all(n == 1 for n in counts.values()), {k: n for k, n in counts.items() if n != 1}
    kept = [s for s in sent if s.offset_msg_id not in removed]
    admin = Admin(store)
    assert all(admin.query_by_uniq_key(topic, s.msg_id) is not None for s in kept)


def test_a_handler_that_raises_fails_the_batch_and_the_next_run_hands_the_versions_over_again(
    spark_reads: Any, store: Store, topic: str, tmp_path: Path
) -> None:
    _send(store, topic, 3)
    seen: list[list[int]] = []
    covered = [-1]

    def failing(rows: Any) -> None:
        raise RuntimeError("disk full")

    def recording(rows: Any) -> None:
        seen.append(rows["_version"].to_pylist())
        covered[0] = max(covered[0], *rows["_version"].to_pylist())

    common = dict(
        job="probe",
        table=schemas.COMMIT_LOG,
        columns=("topic", "queue_offset"),
        marker=lambda: covered[0],
        once=True,
        checkpoint=str(tmp_path / "cp"),
        trigger_ms=100,
    )
    with pytest.raises(Exception, match="disk full"):
        run_log_job(spark_reads, store, handler=failing, **common)  # type: ignore[arg-type]
    run_log_job(spark_reads, store, handler=recording, **common)  # type: ignore[arg-type]
    versions = [v for chunk in seen for v in chunk]
    assert len(versions) == 3 and versions == sorted(set(versions))  # each version once, in order
    assert covered[0] == store.version(schemas.COMMIT_LOG)


def test_end_version_reads_deltalog_and_delta_offsets() -> None:
    def progress(offset: str) -> dict[str, Any]:
        return {"sources": [{"endOffset": offset}]}

    assert end_version(progress('{"version": 7}')) == 7
    assert end_version(progress('{"sourceVersion":1,"reservoirVersion":8,"index":-1}')) == 7
    assert end_version(progress('{"sourceVersion":1,"reservoirVersion":8,"index":3}')) == 8
    assert end_version(progress("not json")) is None


def test_a_delta_triggered_job_restarts_after_log_retention_removed_its_checkpoints_version(
    spark: Any, store: Store, topic: str
) -> None:
    """The soak's broker died of this: a job's Delta stream restarted from a checkpoint whose
    version log retention had removed (``DELTA_VERSION_NOT_FOUND``). Each start keeps its own
    checkpoint sub-directory, and the stale ones go."""
    from engine.broker.index import index_pending
    from engine.spark.session import delta_enabled

    if not delta_enabled(spark):
        pytest.skip("Delta on Spark is off: the Delta jars could not be fetched")
    _send(store, topic, 3)
    run_index(spark, store, once=True)  # Delta's offsets name the commit log's early versions
    location = Path(checkpoint_location(store, "index")) / "delta"
    first = [p.name for p in location.iterdir()]
    _send(store, topic, 4, start=3)
    index_pending(store)  # the marker moves on without the query
    age_and_clean_log(store, schemas.COMMIT_LOG)
    assert earliest_version(store.uri(schemas.COMMIT_LOG)) == store.version(schemas.COMMIT_LOG) > 3
    _send(store, topic, 2, start=7)
    stats = IndexStats()
    query = run_index(spark, store, once=True, stats=stats)
    assert query.exception() is None and stats.rows == 2
    counts = _index_counts(store)
    assert all(f"{topic}:KEY:k{i}" in counts for i in range(9)) and set(counts.values()) == {1}
    second = [p.name for p in location.iterdir()]
    assert len(first) == len(second) == 1 and first != second  # the stale start's offsets are gone


def test_a_delta_stream_never_starts_before_the_oldest_commit_the_log_keeps(
    spark: Any, store: Store, topic: str
) -> None:
    from engine.spark.jobs.streams import delta_start

    _send(store, topic, 4)
    table = schemas.COMMIT_LOG
    assert delta_start(store, table, 0) == 0 and delta_start(store, table, 99) == store.version(table)
    age_and_clean_log(store, table)
    oldest = earliest_version(store.uri(table))
    assert oldest == store.version(table) > 0
    assert delta_start(store, table, 1) == oldest
