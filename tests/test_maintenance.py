"""Maintenance: compaction, checkpoints, consumer-aware retention and vacuum (store level, no Spark)."""

from __future__ import annotations

import itertools
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from engine import (
    Admin,
    InvalidArgumentError,
    Message,
    Producer,
    PullConsumer,
    PullStatus,
    SendResult,
    Store,
)
from engine.broker import maintenance
from engine.broker.dispatch import dispatch_pending
from engine.broker.index import index_pending
from engine.broker.maintenance import (
    MAINTENANCE_KEY,
    DataFile,
    Layout,
    checkpoint,
    compact,
    maintain,
    plan_bins,
    protected_offsets,
    retain,
    vacuum,
)
from engine.config import STORAGE_ENV_PREFIX
from engine.store import maintenance as store_maintenance
from engine.store import schemas
from engine.store.commit_log import CommitLogWriter
from engine.store.commit_log import writer as commit_log
from engine.store.commit_log.hwm import read_hwm
from engine.store.commit_log.stamping import PendingMessage
from engine.store.commit_markers import CQ_KEY, HWM_KEY
from engine.store.consume_queue import queue_marks
from engine.store.consumer_offset import OffsetStore
from engine.store.delta.log import table_filesystem
from engine.store.index import INDEX_SORT, KIND_KEY, KIND_UNIQ_KEY
from tests.fault.procs import event_lines, reap, wait_until, worker
from tests.helpers import commit_log_rows, versions

HOUR_MS = 3_600_000


# ----------------------------------------------------------------------------- helpers
def _fill(store: Store, topic: str, batches: int, per_batch: int = 16, queues: int = 4) -> list[SendResult]:
    """One commit-log commit and one consume-queue commit (one small file each) per batch."""
    sent: list[SendResult] = []
    with Producer(store) as p:
        for i in range(batches):
            msgs = [Message(topic, f"b{i}-m{j}".encode(), tags=f"t{j % 2}") for j in range(per_batch)]
            sent.extend(p.send_batch(msgs, queue_id=i % queues))
            dispatch_pending(store)
    return sent


def _files(store: Store, name: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = pa.table(
        DeltaTable(store.uri(name), storage_options=store.storage_options).get_add_actions(flatten=True)
    ).to_pylist()
    return rows


def _ranges(store: Store) -> list[tuple[int, int]]:
    return sorted(
        (f["min.physical_offset"], f["max.physical_offset"]) for f in _files(store, schemas.COMMIT_LOG)
    )


def _assert_disjoint(ranges: list[tuple[int, int]]) -> None:
    for (_, hi), (lo, _) in itertools.pairwise(ranges):
        assert hi < lo, f"overlapping commit-log files: {ranges}"


def _pull_all(consumer: PullConsumer, topic: str, queues: int = 4, start: int = 0) -> list[list[str]]:
    out = []
    for q in range(queues):
        ids: list[str] = []
        offset = start
        while True:  # a pull returns at most 32 messages (RocketMQ's transfer cap)
            r = consumer.pull(topic, q, offset, max_nums=1024)
            if not r.messages:
                break
            ids.extend(m.offset_msg_id for m in r.messages)
            offset = r.next_begin_offset
        out.append(ids)
    return out


def _sorted_table(store: Store, name: str, keys: list[str]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = DeltaTable(store.uri(name)).to_pyarrow_table().to_pylist()
    return sorted(rows, key=lambda r: tuple(r[k] for k in keys))


def _commit_json(store: Store, name: str, version: int) -> list[dict[str, Any]]:
    path = Path(store.uri(name)) / "_delta_log" / f"{version:020d}.json"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _old_clock(monkeypatch: pytest.MonkeyPatch, hours_ago: float) -> None:
    """Stamp the next messages as stored ``hours_ago`` (the sequencer's clock)."""
    then = int(time.time() * 1000 - hours_ago * HOUR_MS)
    monkeypatch.setattr(commit_log, "now_ms", lambda: then)


# ----------------------------------------------------------------------------- compaction
def test_compaction_merges_small_files_and_keeps_every_row_in_physical_order(
    store: Store, topic: str
) -> None:
    _fill(store, topic, 24)  # 384 messages: more than one 256-row group
    log_before = commit_log_rows(store)
    cq_before = _sorted_table(store, schemas.CONSUME_QUEUE, ["topic", "queue_id", "queue_offset"])
    hwm_before = read_hwm(store.snapshot(schemas.COMMIT_LOG)).to_json()
    cq_marks_before = queue_marks(store.snapshot(schemas.CONSUME_QUEUE)).to_json()

    report = compact(store, min_files=2)

    log, cq = report[schemas.COMMIT_LOG], report[schemas.CONSUME_QUEUE]
    assert (log["files_before"], log["files_after"], log["rows_rewritten"]) == (24, 1, 384)
    assert (cq["files_before"], cq["files_after"]) == (24, 1)
    assert commit_log_rows(store) == log_before
    assert _sorted_table(store, schemas.CONSUME_QUEUE, ["topic", "queue_id", "queue_offset"]) == cq_before
    # Row groups of 256 rows, as the sequencer writes them, so pulls decode little.
    (path,) = [f["path"] for f in _files(store, schemas.COMMIT_LOG)]
    meta = pq.ParquetFile(Path(store.uri(schemas.COMMIT_LOG)) / path).metadata
    assert [meta.row_group(i).num_rows for i in range(meta.num_row_groups)] == [256, 128]
    # The consume queue is clustered by (topic, queue_id, queue_offset).
    (cq_path,) = [f["path"] for f in _files(store, schemas.CONSUME_QUEUE)]
    clustered = pq.read_table(Path(store.uri(schemas.CONSUME_QUEUE)) / cq_path).to_pylist()
    assert clustered == sorted(clustered, key=lambda r: (r["topic"], r["queue_id"], r["queue_offset"]))
    # The commits move rows only (dataChange=false) and carry the markers forward.
    for name, key, before in (
        (schemas.COMMIT_LOG, HWM_KEY, hwm_before),
        (schemas.CONSUME_QUEUE, CQ_KEY, cq_marks_before),
    ):
        version = report[name]["version"]
        assert version is not None
        actions = _commit_json(store, name, version)
        files = [a.get("add") or a.get("remove") for a in actions if "add" in a or "remove" in a]
        assert files and all(f["dataChange"] is False for f in files)
        info = next(a["commitInfo"] for a in actions if "commitInfo" in a)
        assert info[key] == before and info[MAINTENANCE_KEY] == "compact"
    assert DeltaTable(store.uri(schemas.COMMIT_LOG)).to_pyarrow_table().num_rows == 384


def test_compaction_only_merges_consecutive_files_so_ranges_stay_disjoint(store: Store, topic: str) -> None:
    _fill(store, topic, 12)
    # One large file in the middle must not be merged across.
    big = [f for f in _files(store, schemas.COMMIT_LOG)]
    big.sort(key=lambda f: f["min.physical_offset"])
    middle = big[5]["size_bytes"]
    target = int(middle * 1.5)  # the middle file is "large" (>= half the target) only if it is bigger
    _fill(store, topic, 1, per_batch=400)  # one big file at the end
    _fill(store, topic, 6)
    report = compact(store, schemas.COMMIT_LOG, min_files=2, target_file_size=max(target, 4 * middle))
    assert report[schemas.COMMIT_LOG]["version"] is not None
    ranges = _ranges(store)
    _assert_disjoint(ranges)
    assert report[schemas.COMMIT_LOG]["files_after"] < report[schemas.COMMIT_LOG]["files_before"]


def test_pulls_return_the_same_messages_after_compaction_and_vacuum(store: Store, topic: str) -> None:
    _fill(store, topic, 16)
    stale = PullConsumer(store, "g")  # holds the pre-compaction snapshot and file caches
    before = _pull_all(stale, topic)
    filtered = [m.msg_id for m in stale.pull(topic, 1, 0, max_nums=64, expression="t1").messages]
    compact(store, min_files=2)
    assert _pull_all(PullConsumer(store, "g"), topic) == before
    assert _pull_all(stale, topic) == before
    vacuum(store, 0)
    assert _pull_all(stale, topic) == before  # the old files are gone: it refreshes and reads again
    again = [
        m.msg_id for m in PullConsumer(store, "g").pull(topic, 1, 0, max_nums=64, expression="t1").messages
    ]
    assert again == filtered


def test_dispatch_after_compaction_dispatches_only_new_versions(store: Store, topic: str) -> None:
    _fill(store, topic, 10)
    compact(store, min_files=2)
    with Producer(store) as p:
        for i in range(3):
            p.send_batch([Message(topic, f"new{i}-{j}".encode()) for j in range(5)], queue_id=i)
    assert dispatch_pending(store) == 15
    assert dispatch_pending(store) == 0
    entries = DeltaTable(store.uri(schemas.CONSUME_QUEUE)).to_pyarrow_table().to_pylist()
    assert len(entries) == 175
    for q in range(4):
        offsets = sorted(e["queue_offset"] for e in entries if e["queue_id"] == q)
        assert offsets == list(range(len(offsets)))
    assert [m.body for m in PullConsumer(store, "g").pull(topic, 0, 48).messages] == [
        f"new0-{j}".encode() for j in range(5)
    ]


def test_undispatched_commit_log_files_are_not_compacted(store: Store, topic: str) -> None:
    _fill(store, topic, 4)
    with Producer(store) as p:
        for i in range(6):
            p.send(Message(topic, f"late{i}".encode()), queue_id=0)
    report = compact(store, schemas.COMMIT_LOG, min_files=2)
    ranges = _ranges(store)
    assert report[schemas.COMMIT_LOG]["files_after"] == 7  # 4 dispatched merged into 1, 6 left alone
    _assert_disjoint(ranges)
    assert dispatch_pending(store) == 6


def test_compaction_below_min_files_changes_nothing(store: Store, topic: str) -> None:
    _fill(store, topic, 3)
    before = versions(store)
    report = compact(store, min_files=8)
    assert all(r["version"] is None for r in report.values())
    assert versions(store) == before


def test_compaction_concurrent_with_producers_dispatch_and_pulls_loses_nothing(
    store: Store, topic: str
) -> None:
    prefill = _fill(store, topic, 12, per_batch=8)
    sent: list[SendResult] = []
    errors: list[BaseException] = []
    done = threading.Event()
    lock = threading.Lock()

    def produce(worker: int) -> None:
        try:
            with Producer(store) as p:
                for i in range(25):
                    msgs = [Message(topic, f"w{worker}-{i}-{j}".encode()) for j in range(4)]
                    results = p.send_batch(msgs, queue_id=(worker + i) % 4)
                    with lock:
                        sent.extend(results)
        except BaseException as exc:
            errors.append(exc)

    def dispatch_and_pull() -> None:
        consumer = PullConsumer(store, "g")
        try:
            while not done.is_set():
                dispatch_pending(store)
                for q in range(4):
                    r = consumer.pull(topic, q, 0, max_nums=1024)
                    offsets = [m.queue_offset for m in r.messages]
                    assert offsets == list(range(len(offsets)))
        except BaseException as exc:
            errors.append(exc)

    producers = [threading.Thread(target=produce, args=(w,)) for w in range(2)]
    reader = threading.Thread(target=dispatch_and_pull)
    for t in [*producers, reader]:
        t.start()
    committed = 0
    while any(t.is_alive() for t in producers):
        report = compact(store, [schemas.COMMIT_LOG, schemas.CONSUME_QUEUE], min_files=2)
        committed += sum(r["version"] is not None for r in report.values())
        time.sleep(0.01)
    done.set()
    for t in [*producers, reader]:
        t.join()
    assert not errors, errors
    assert committed >= 1
    dispatch_pending(store)
    compact(store, min_files=2)

    rows = commit_log_rows(store)
    everything = prefill + sent
    assert len(rows) == len(everything) == 96 + 200
    by_id = {r["msg_id"]: r for r in rows}
    assert len(by_id) == len(rows)
    for s in everything:
        assert by_id[s.offset_msg_id]["queue_offset"] == s.queue_offset
    for q in range(4):
        offsets = sorted(r["queue_offset"] for r in rows if r["queue_id"] == q)
        assert offsets == list(range(len(offsets)))
    _assert_disjoint(_ranges(store))
    pulled = _pull_all(PullConsumer(store, "g"), topic)
    assert sorted(m for q in pulled for m in q) == sorted(by_id)


def test_commit_log_compaction_lands_beside_a_producer_process_that_never_stops(
    any_store: Store, tmp_path: Path
) -> None:
    # A producer of another process appends every few milliseconds (as a busy broker does). Racing
    # it, a compaction lost every race once its refresh took longer than the pause between two
    # appends, and the small files it left made every refresh slower: it never landed again. On a
    # local disk the compaction now queues on the writers' host lock; on S3 (no lock) a lost race
    # follows the winners' commit files and lands after them (every pass lost 64 races before).
    store, topic = any_store, "T"
    Admin(store).create_topic(topic, 4)
    producer = worker(
        "producer",
        "producer",
        tmp_path,
        {STORAGE_ENV_PREFIX + k: v for k, v in (store.storage_options or {}).items()},
        store=store.root,
        topic=topic,
        history=tmp_path / "producer.jsonl",
        prefix="p",
        count=10**6,
        batch=4,
        pause_ms=5,
    )
    try:
        wait_until(lambda: event_lines(tmp_path / "producer.jsonl") >= 50, 60, "the producer's appends")
        for _ in range(4):
            time.sleep(1.0)
            dispatch_pending(store)
            report = compact(store, schemas.COMMIT_LOG, min_files=2)[schemas.COMMIT_LOG]
            assert report["version"] is not None, report
            assert report["files_removed"] >= 2
        counters = producer.stop()
    finally:
        reap()
    assert counters.get("conflict_errors", 0) == 0, counters
    dispatch_pending(store)
    rows = commit_log_rows(store)
    assert len({r["msg_id"] for r in rows}) == len(rows)
    for q in range(4):
        offsets = sorted(r["queue_offset"] for r in rows if r["queue_id"] == q)
        assert offsets == list(range(len(offsets)))
    _assert_disjoint(_ranges(store))


def _race_the_plan(store: Store, monkeypatch: pytest.MonkeyPatch, rival: Any) -> list[int]:
    """Run ``rival()`` between a maintenance commit's first plan and its commit (as a writer of
    another host would, the host lock off); returns the versions each plan was made on."""
    monkeypatch.setenv("MQ_SEQUENCER_LOCK", "0")
    real = store_maintenance.current_markers
    plans: list[int] = []

    def winners_meanwhile(dt: Any, keys: Any) -> Any:
        plans.append(dt.version())
        if len(plans) == 1:
            rival()
        return real(dt, keys)

    monkeypatch.setattr(store_maintenance, "current_markers", winners_meanwhile)
    return plans


def _four_small_files(store: Store, topic: str) -> None:
    Admin(store).create_topic(topic, 2)
    with Producer(store) as p:
        for i in range(4):
            p.send(Message(topic, f"m{i}".encode()), queue_id=i % 2)
    dispatch_pending(store)


def test_a_compaction_that_loses_its_race_lands_after_the_winners_with_the_marks_they_moved(
    any_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Three appends land between the compaction's plan and its commit: it reads their commit files
    # and lands right after them, planned once, carrying the high-water marks their appends moved
    # on (stale marks would give queue 0's next send an offset already taken).
    store, topic = any_store, "T"
    _four_small_files(store, topic)

    def three_appends() -> None:
        with Producer(store) as rival:
            for i in range(3):
                rival.send(Message(topic, f"r{i}".encode()), queue_id=0)

    plans = _race_the_plan(store, monkeypatch, three_appends)
    report = compact(store, schemas.COMMIT_LOG, min_files=2)[schemas.COMMIT_LOG]
    assert len(plans) == 1
    assert report["version"] == plans[0] + 4
    assert report["files_removed"] == 4 and report["files_added"] == 1
    snapshot = store.snapshot(schemas.COMMIT_LOG)
    assert snapshot.version() == report["version"]
    assert snapshot.commit_info(report["version"])[MAINTENANCE_KEY] == "compact"
    marks = read_hwm(snapshot)
    assert (marks.next_queue_offset(topic, 0), marks.next_queue_offset(topic, 1)) == (5, 2)
    with Producer(store) as p:
        assert p.send(Message(topic, b"after"), queue_id=0).queue_offset == 5
    rows = commit_log_rows(store)
    assert sorted(r["body"] for r in rows) == sorted(
        [f"m{i}".encode() for i in range(4)] + [f"r{i}".encode() for i in range(3)] + [b"after"]
    )
    assert sorted(r["queue_offset"] for r in rows if r["queue_id"] == 0) == list(range(6))
    checkpoint(store, schemas.COMMIT_LOG)  # delta-rs checkpoints a commit it did not write
    assert store.snapshot(schemas.COMMIT_LOG).version() == report["version"] + 1
    assert store.read(schemas.COMMIT_LOG).num_rows == 8


def test_a_compaction_whose_files_a_winner_removed_is_planned_again_and_drops_them(
    any_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The winner is another compaction of the same files: following stops at its remove actions,
    # the plan is made again on the new snapshot, finds its files gone and commits nothing.
    store, topic = any_store, "T"
    _four_small_files(store, topic)
    before = {f["path"] for f in _files(store, schemas.COMMIT_LOG)}
    inner: list[dict[str, Any]] = []
    plans = _race_the_plan(
        store, monkeypatch, lambda: inner.append(compact(store, schemas.COMMIT_LOG, min_files=2))
    )
    report = compact(store, schemas.COMMIT_LOG, min_files=2)[schemas.COMMIT_LOG]
    assert inner[0][schemas.COMMIT_LOG]["version"] == plans[0] + 1
    # (the outer plan made again finds its files gone: nothing to commit, no markers asked for)
    assert report["version"] is None and len(plans) == 2
    assert len(_files(store, schemas.COMMIT_LOG)) == 1
    assert sorted(r["body"] for r in commit_log_rows(store)) == [f"m{i}".encode() for i in range(4)]
    # the file the outer compaction wrote was deleted; the inner one's and the removed ones remain
    live = {f["path"] for f in _files(store, schemas.COMMIT_LOG)}
    assert store_maintenance.listing(store, schemas.COMMIT_LOG) == live | before


def test_a_compaction_that_a_metadata_change_won_against_is_planned_again(
    any_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, topic = any_store, "T"
    _four_small_files(store, topic)
    plans = _race_the_plan(
        store,
        monkeypatch,
        lambda: store.snapshot(schemas.COMMIT_LOG).set_properties({"delta.checkpointInterval": "50"}),
    )
    report = compact(store, schemas.COMMIT_LOG, min_files=2)[schemas.COMMIT_LOG]
    assert len(plans) == 2 and plans[1] == plans[0] + 1
    assert report["version"] == plans[1] + 1 and report["files_removed"] == 4
    snapshot = store.snapshot(schemas.COMMIT_LOG)
    assert snapshot.configuration()["delta.checkpointInterval"] == "50"
    assert read_hwm(snapshot).next_queue_offset(topic, 0) == 2


def test_other_tables_are_bin_packed_while_appends_continue(store: Store, topic: str) -> None:
    offsets = OffsetStore(store, "g")
    for i in range(10):
        offsets.commit([(topic, i % 4, i)])
    expected = offsets.read(topic)
    stop = threading.Event()
    extra: list[int] = []
    errors: list[BaseException] = []

    def commit_more() -> None:
        try:
            other = OffsetStore(store, "h")
            i = 0
            while not stop.is_set() and i < 30:
                other.commit([(topic, 0, i)])
                extra.append(i)
                i += 1
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=commit_more)
    t.start()
    report = compact(store, schemas.CONSUMER_OFFSET, min_files=2)
    stop.set()
    t.join()
    assert not errors, errors
    assert report[schemas.CONSUMER_OFFSET]["version"] is not None
    assert OffsetStore(store, "g").read(topic) == expected
    rows = DeltaTable(store.uri(schemas.CONSUMER_OFFSET)).to_pyarrow_table().num_rows
    assert rows == 10 + len(extra)


def test_compacting_every_table_goes_on_past_one_that_loses_every_race(
    store: Store, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from engine.broker import compaction
    from engine.errors import CommitConflictError

    _fill(store, topic, 4)
    real = compaction.commit_planned

    def busy_commit_log(on: Store, name: str, *args: Any, **kwargs: Any) -> Any:
        if name == schemas.COMMIT_LOG:  # a steady producer wins every race on it
            raise CommitConflictError("compact of commit_log lost 64 races", table=name)
        return real(on, name, *args, **kwargs)

    monkeypatch.setattr(compaction, "commit_planned", busy_commit_log)
    with pytest.raises(CommitConflictError, match="compaction of commit_log lost every race") as caught:
        compact(store, min_files=2)
    assert caught.value.context["tables"] == [schemas.COMMIT_LOG]
    compacted = caught.value.context["compacted"]
    assert schemas.COMMIT_LOG not in compacted and compacted[schemas.CONSUME_QUEUE]["files_after"] == 1
    assert len(_files(store, schemas.CONSUME_QUEUE)) == 1 and len(_files(store, schemas.COMMIT_LOG)) == 4
    with pytest.raises(CommitConflictError, match="lost 64 races"):  # one table: its own error
        compact(store, schemas.COMMIT_LOG, min_files=2)


def test_index_compaction_keeps_one_key_sorted_file_per_kind(store: Store, topic: str) -> None:
    # Four index passes whose keys arrive in descending order: each writes a KEY and a UNIQ_KEY file.
    with Producer(store) as p:
        for i in range(4):
            p.send(Message(topic, f"m{i}".encode(), keys=(f"key-{3 - i}", f"other-{i}")))
            index_pending(store)
    before = _sorted_table(store, schemas.INDEX, list(INDEX_SORT))
    report = compact(store, schemas.INDEX, min_files=2)
    assert report[schemas.INDEX]["version"] is not None
    assert report[schemas.INDEX]["files_after"] == 2
    assert _sorted_table(store, schemas.INDEX, list(INDEX_SORT)) == before
    fs = table_filesystem(store.uri(schemas.INDEX))
    kinds = []
    for f in _files(store, schemas.INDEX):
        rows = pq.read_table(f["path"], filesystem=fs)
        [kind] = set(rows["kind"].to_pylist())  # kinds never share a file
        kinds.append(kind)
        assert rows.to_pylist() == rows.sort_by([(c, "ascending") for c in INDEX_SORT]).to_pylist()
        assert (f["min.key"], f["max.key"]) == (rows["key"][0].as_py(), rows["key"][-1].as_py())
    assert sorted(kinds) == [KIND_KEY, KIND_UNIQ_KEY]
    [found] = Admin(store).query_by_key(topic, "key-1", 0, 2**62)
    assert found.body == b"m2"


def test_plan_bins_never_merges_across_a_large_or_undispatched_file() -> None:
    layout = Layout(100, ("physical_offset",), "physical_offset")
    files = [DataFile(f"f{i}", 10, 1, i, i * 10, i * 10 + 9) for i in range(6)]
    files[2] = DataFile("big", 90, 1, 2, 20, 29)
    bins = plan_bins(files, layout, 2, 100, watermark=49)
    assert [[f.path for f in b] for b in bins] == [["f0", "f1"], ["f3", "f4"]]
    # Overlapping files are merged together (restoring disjoint ranges), even if not small.
    overlapping = [
        DataFile("a", 90, 1, 0, 0, 50),
        DataFile("b", 90, 1, 1, 40, 60),
        DataFile("c", 10, 1, 2, 61, 70),
    ]
    assert [[f.path for f in b] for b in plan_bins(overlapping, layout, 2, 100)] == [["a", "b"]]
    assert plan_bins(files, layout, 5, 100, watermark=49) == []


def test_plan_bins_packs_consecutive_files_up_to_the_target() -> None:
    layout = Layout(100, ("physical_offset",), "physical_offset")
    files = [DataFile(f"f{i}", 30, 1, i, i * 10, i * 10 + 9) for i in range(7)]
    assert [[f.path for f in b] for b in plan_bins(files, layout, 2, 100)] == [
        ["f0", "f1", "f2"],
        ["f3", "f4", "f5"],
    ]
    clustered = Layout(100, ("topic",), clustered=True)
    assert [len(b) for b in plan_bins(files, clustered, 2, 100)] == [7]


# ----------------------------------------------------------------------------- checkpoints, vacuum
def test_checkpoint_keeps_tables_readable_and_markers_found(store: Store, topic: str) -> None:
    _fill(store, topic, 5)
    hwm = read_hwm(store.snapshot(schemas.COMMIT_LOG)).to_json()
    result = checkpoint(store)
    assert set(result) == set(schemas.SCHEMAS)
    log_dir = Path(store.uri(schemas.COMMIT_LOG)) / "_delta_log"
    assert (log_dir / f"{result[schemas.COMMIT_LOG]:020d}.checkpoint.parquet").exists()
    assert read_hwm(store.snapshot(schemas.COMMIT_LOG)).to_json() == hwm
    sent = _fill(store, topic, 1)
    assert [s.queue_offset for s in sent] == list(range(32, 48))
    for name in schemas.SCHEMAS:
        DeltaTable(store.uri(name)).to_pyarrow_table()


def test_vacuum_deletes_removed_files_and_leaves_tables_readable(store: Store, topic: str) -> None:
    _fill(store, topic, 8)
    compact(store, min_files=2)
    on_disk = len(list(Path(store.uri(schemas.COMMIT_LOG)).glob("*.parquet")))
    assert vacuum(store, 24)[schemas.COMMIT_LOG] == 0  # inside the window: kept
    removed = vacuum(store, 0)
    assert removed[schemas.COMMIT_LOG] == 8 and removed[schemas.CONSUME_QUEUE] == 8
    assert len(list(Path(store.uri(schemas.COMMIT_LOG)).glob("*.parquet"))) == on_disk - 8
    before = versions(store)
    assert sum(vacuum(store, 0).values()) == 0  # nothing left: no commit either
    assert versions(store) == before
    assert DeltaTable(store.uri(schemas.COMMIT_LOG)).to_pyarrow_table().num_rows == 128
    assert sum(len(q) for q in _pull_all(PullConsumer(store, "g"), topic)) == 128


def test_vacuum_deletes_untracked_files_once_older_than_an_hours_window(store: Store, topic: str) -> None:
    _fill(store, topic, 2)
    table_dir = Path(store.uri(schemas.COMMIT_LOG))
    old, young = table_dir / "part-crashed-writer.parquet", table_dir / "part-in-the-making.parquet"
    for path in (old, young):
        pq.write_table(pa.table({"x": [1]}), path)
    day_ago = time.time() - 25 * 3600
    os.utime(old, (day_ago, day_ago))

    assert vacuum(store, 0)[schemas.COMMIT_LOG] == 0  # under an hour: tombstones only, never strays
    assert old.exists() and young.exists()
    assert vacuum(store, 24)[schemas.COMMIT_LOG] == 1
    assert not old.exists() and young.exists()
    assert DeltaTable(store.uri(schemas.COMMIT_LOG)).to_pyarrow_table().num_rows == 32


# ----------------------------------------------------------------------------- retention
def test_protected_offsets_take_the_smallest_over_every_consumer() -> None:
    rows = [
        {"group": "a", "consumer_id": "", "topic": "T", "queue_id": 0, "offset": 5, "ts_ms": 1},
        {"group": "a", "consumer_id": "", "topic": "T", "queue_id": 0, "offset": 9, "ts_ms": 2},
        {"group": "a", "consumer_id": "", "topic": "T", "queue_id": 1, "offset": 4, "ts_ms": 1},
        {"group": "b", "consumer_id": "", "topic": "T", "queue_id": 0, "offset": 7, "ts_ms": 1},
        {"group": "c", "consumer_id": "x", "topic": "U", "queue_id": 0, "offset": 3, "ts_ms": 1},
    ]
    # group b never committed queue 1: it needs it from 0.
    assert protected_offsets(rows) == {"T": {0: 7, 1: 0}, "U": {0: 3}}


def test_retention_removes_old_consumed_messages_and_raises_min_offset(
    store: Store, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _old_clock(monkeypatch, 100)
    _fill(store, topic, 4, per_batch=10)  # queues 0..3, offsets 0..9 each, 100 h old
    monkeypatch.undo()
    _fill(store, topic, 4, per_batch=5)  # offsets 10..14, new
    consumer = PullConsumer(store, "g")
    consumer.commit_offset(topic, 0, 8)  # consumed 0..7 of queue 0
    consumer.commit_offset(topic, 1, 12)  # consumed all old messages of queue 1, and two new ones
    for q in (2, 3):
        consumer.commit_offset(topic, q, 0)
    total = len(commit_log_rows(store))

    report = retain(store)

    assert report["min_offsets"] == {topic: {0: 8, 1: 10}}
    assert report["rows_removed"] == 18 and report["consume_queue_entries_removed"] == 18
    assert (report["files_removed"], report["files_rewritten"]) == (1, 1)  # queue 1 whole, queue 0 rewritten
    assert len(commit_log_rows(store)) == total - 18
    fresh = PullConsumer(store, "g")
    r = fresh.pull(topic, 0, 0)
    assert (r.status, r.next_begin_offset, r.min_offset) == (PullStatus.OFFSET_ILLEGAL, 8, 8)
    r = fresh.pull(topic, 0, 8, max_nums=3)
    assert [m.body for m in r.messages] == [b"b0-m8", b"b0-m9", b"b0-m0"]
    assert fresh.pull(topic, 1, 9).next_begin_offset == 10
    assert [m.queue_offset for m in fresh.pull(topic, 2, 0, max_nums=100).messages] == list(range(15))
    assert consumer.pull(topic, 0, 0).status is PullStatus.OFFSET_ILLEGAL  # a consumer that was open
    # The consume-queue commit raised the marks; entries below them are gone.
    entries = DeltaTable(store.uri(schemas.CONSUME_QUEUE)).to_pyarrow_table().to_pylist()
    assert min(e["queue_offset"] for e in entries if e["queue_id"] == 0) == 8
    assert not [e for e in entries if e["queue_id"] == 1 and e["queue_offset"] < 10]
    # A second pass has nothing to do and commits nothing.
    before = versions(store)
    again = retain(store)
    assert again["rows_removed"] == 0 and again["versions"] == {}
    assert versions(store) == before
    # The sequencer's marks survived: new messages continue each queue.
    assert [s.queue_offset for s in _fill(store, topic, 1, per_batch=2)] == [15, 16]
    for name in schemas.SCHEMAS:
        DeltaTable(store.uri(name)).to_pyarrow_table()


def test_retention_keeps_unconsumed_messages_unless_forced(
    store: Store, admin: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    admin.create_topic("Orphan", 2)
    admin.create_topic("Read", 2)
    _old_clock(monkeypatch, 100)
    _fill(store, "Orphan", 2, per_batch=5, queues=2)
    _fill(store, "Read", 2, per_batch=5, queues=2)
    monkeypatch.undo()
    PullConsumer(store, "g").commit_offset("Read", 0, 5)  # queue 1 never consumed by g

    report = retain(store)
    assert report["protected_topics"] == ["Orphan"]
    assert report["min_offsets"] == {"Read": {0: 5}}
    assert len(commit_log_rows(store)) == 15

    forced = retain(store, force=True)
    assert forced["min_offsets"] == {"Orphan": {0: 5, 1: 5}, "Read": {1: 5}}
    assert commit_log_rows(store) == []
    r = PullConsumer(store, "g").pull("Orphan", 1, 0)
    assert (r.status, r.next_begin_offset) == (PullStatus.OFFSET_ILLEGAL, 5)


def test_retention_keeps_messages_younger_than_the_window(store: Store, topic: str) -> None:
    _fill(store, topic, 4, per_batch=5)
    for q in range(4):
        PullConsumer(store, "g").commit_offset(topic, q, 5)
    assert retain(store)["rows_removed"] == 0
    later = retain(store, 1, now_ms=int(time.time() * 1000) + 2 * HOUR_MS)
    assert later["rows_removed"] == 20
    assert commit_log_rows(store) == []
    assert retain(store, 0, now_ms=int(time.time() * 1000) + 3 * HOUR_MS)["versions"] == {}


def test_retention_removes_index_files_of_deleted_messages(store: Store, topic: str) -> None:
    sent = _fill(store, topic, 2, per_batch=5, queues=1)
    rows = [
        {
            "topic": topic,
            "kind": "UNIQ_KEY",
            "key": s.uniq_key,
            "physical_offset": s.physical_offset,
            "queue_id": s.queue_id,
            "queue_offset": s.queue_offset,
            "store_ts_ms": 0,
            "log_version": 0,
        }
        for s in sent
    ]
    store.append(schemas.INDEX, pa.Table.from_pylist(rows[:5], schema=schemas.INDEX_SCHEMA))
    store.append(schemas.INDEX, pa.Table.from_pylist(rows[5:], schema=schemas.INDEX_SCHEMA))
    PullConsumer(store, "g").commit_offset(topic, 0, 5)
    report = retain(store, 0, now_ms=int(time.time() * 1000) + HOUR_MS)
    assert report["rows_removed"] == 5 and report["index_files_removed"] == 1
    keys = DeltaTable(store.uri(schemas.INDEX)).to_pyarrow_table()["key"].to_pylist()
    assert keys == [s.uniq_key for s in sent[5:]]


def test_retention_rewrites_a_file_shared_with_an_unconsumed_queue(store: Store, topic: str) -> None:
    writer = CommitLogWriter(store)
    writer.append(
        [PendingMessage(topic, q, f"q{q}-{i}".encode(), f"u{q}-{i}") for q in (0, 1) for i in range(3)]
    )
    dispatch_pending(store)
    PullConsumer(store, "g").commit_offset(topic, 0, 3)
    PullConsumer(store, "g").commit_offset(topic, 1, 0)
    report = retain(store, 0, now_ms=int(time.time() * 1000) + HOUR_MS)
    assert (report["files_removed"], report["files_rewritten"], report["rows_removed"]) == (0, 1, 3)
    rewrite = _commit_json(store, schemas.COMMIT_LOG, report["versions"][schemas.COMMIT_LOG])
    adds = [a["add"] for a in rewrite if "add" in a]
    removes = [a["remove"] for a in rewrite if "remove" in a]
    assert [a["dataChange"] for a in adds] == [False] and [r["dataChange"] for r in removes] == [True]
    assert [m.body for m in PullConsumer(store, "g").pull(topic, 1, 0).messages] == [
        b"q1-0",
        b"q1-1",
        b"q1-2",
    ]


# ----------------------------------------------------------------------------- bad input, one pass
@pytest.mark.parametrize(
    "call",
    [
        lambda s: retain(s, -1),
        lambda s: retain(s, float("nan")),
        lambda s: retain(s, now_ms=-5),
        lambda s: vacuum(s, -1),
        lambda s: vacuum(s, 0, enforce_retention_duration=True),
        lambda s: compact(s, "nope"),
        lambda s: compact(s, min_files=1),
        lambda s: compact(s, target_file_size=0),
        lambda s: checkpoint(s, ["commit_log", "nope"]),
        lambda s: maintain(s, vacuum_retention_hours=-2),
    ],
    ids=[
        "negative-hours",
        "nan-hours",
        "negative-now",
        "negative-vacuum",
        "vacuum-below-table-minimum",
        "unknown-table",
        "min-files",
        "target-size",
        "checkpoint-unknown-table",
        "maintain-negative-vacuum",
    ],
)
def test_bad_input_is_a_typed_error_and_changes_nothing(store: Store, topic: str, call: Any) -> None:
    _fill(store, topic, 4)
    compact(store, min_files=2)
    before = versions(store)
    with pytest.raises(InvalidArgumentError):
        call(store)
    assert versions(store) == before


def test_one_pass_runs_every_step(store: Store, topic: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _old_clock(monkeypatch, 80)
    _fill(store, topic, 8, per_batch=4)
    monkeypatch.undo()
    for q in range(4):
        PullConsumer(store, "g").commit_offset(topic, q, 4)
    report = maintain(store, min_files=2, vacuum_retention_hours=0)
    assert not report.errors
    assert report.retention is not None and report.retention["rows_removed"] == 16
    assert report.compaction[schemas.COMMIT_LOG]["files_after"] == 1
    assert set(report.checkpoints) == set(schemas.SCHEMAS)
    assert report.vacuumed[schemas.COMMIT_LOG] > 0
    line = report.summary()
    assert line.startswith("maintenance: compacted commit_log ") and "\n" not in line
    assert f"new min offsets {topic}:0=4" in line
    assert sum(len(q) for q in _pull_all(PullConsumer(store, "g"), topic, start=4)) == 16


def test_a_failing_step_is_reported_and_the_pass_goes_on(
    store: Store, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fill(store, topic, 4)

    def lose(*args: Any, **kwargs: Any) -> Any:
        from engine.errors import CommitConflictError

        raise CommitConflictError("lost", table="commit_log")

    monkeypatch.setattr(maintenance, "retain", lose)
    report = maintain(store, min_files=2)
    assert report.errors == ("retention: lost",)
    assert report.compaction[schemas.COMMIT_LOG]["version"] is not None


# ----------------------------------------------------------------------------- the job
def test_job_once_runs_one_pass_and_prints_one_line(
    store: Store, topic: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from jobs.maintenance import main

    _fill(store, topic, 4)
    assert main(["--store", store.root, "--once", "--min-files", "2", "--vacuum-hours", "0"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("maintenance: compacted commit_log 4->1 files")
    assert len(_files(store, schemas.COMMIT_LOG)) == 1


@pytest.mark.parametrize(
    "args",
    [["--file-reserved-hours", "-1"], ["--interval", "0"], ["--min-files", "1"], ["--min-files", "x"]],
    ids=["negative-hours", "zero-interval", "min-files", "not-an-int"],
)
def test_job_bad_arguments_are_one_line_and_exit_2(
    store: Store, capsys: pytest.CaptureFixture[str], args: list[str]
) -> None:
    from jobs.maintenance import main

    before = versions(store)
    assert main(["--store", store.root, "--once", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("jobs/maintenance.py: error:")
    assert versions(store) == before


def test_job_with_a_store_that_is_a_file_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from jobs.maintenance import main

    path = tmp_path / "f"
    path.write_text("x")
    assert main(["--store", str(path), "--once"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("jobs/maintenance.py: error:")


@pytest.mark.spark
def test_periodic_run_is_a_ticker_query_running_one_pass_per_tick(
    spark: Any, store: Store, topic: str, tmp_path: Path
) -> None:
    from engine.spark.jobs.maintenance import PassOptions, run_maintenance

    _fill(store, topic, 4)
    passes: list[maintenance.MaintenanceReport] = []
    ticked = threading.Event()

    def on_pass(report: maintenance.MaintenanceReport) -> None:
        passes.append(report)
        ticked.set()

    query = run_maintenance(
        spark,
        store,
        once=False,
        checkpoint=str(tmp_path / "ckpt"),
        options=PassOptions(min_files=2, vacuum_retention_hours=0),
        interval_s=0.5,
        on_pass=on_pass,
    )
    try:
        assert ticked.wait(60), "no maintenance pass within 60 s"
    finally:
        query.stop()
    assert not passes[0].errors
    assert len(_files(store, schemas.COMMIT_LOG)) == 1


@pytest.mark.parametrize("landed", [True, False], ids=["after-the-commit", "before-the-commit"])
def test_a_compaction_whose_commit_met_a_listing_gap_is_found_or_made_again_once(
    store: Store, topic: str, landed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    import engine.store.maintenance as maintenance_commits
    from engine.errors import CommitStateUnknownError

    _fill(store, topic, 6)
    rows_before = commit_log_rows(store)
    real_commit_next, calls = maintenance_commits.commit_next, []

    def gapped(snapshot: Any, **kwargs: Any) -> int:
        calls.append(1)
        if len(calls) == 1 and snapshot.name == schemas.COMMIT_LOG:
            if landed:
                real_commit_next(snapshot, **kwargs)
            cause = OSError("Generic delta kernel error: Expected contiguous commit files, but found gap")
            raise CommitStateUnknownError("commit failed; outcome unknown", cause=cause) from cause
        return real_commit_next(snapshot, **kwargs)

    monkeypatch.setattr(maintenance_commits, "commit_next", gapped)
    before = store.version(schemas.COMMIT_LOG)
    report = compact(store, schemas.COMMIT_LOG, min_files=2)
    log = report[schemas.COMMIT_LOG]
    assert (log["files_before"], log["files_after"], log["version"]) == (6, 1, before + 1)
    assert store.version(schemas.COMMIT_LOG) == before + 1  # committed exactly once
    assert commit_log_rows(store) == rows_before
    assert len(calls) == (1 if landed else 2)
