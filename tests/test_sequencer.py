"""The sequencer's invariants (offsets given once at commit, dense, monotonic) under concurrency,
conflicts and I/O failures."""

from __future__ import annotations

import contextlib
import fcntl
import multiprocessing as mp
import os
import shutil
import threading
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError

import engine.store.commit_log.writer as sequencer
import engine.store.delta.commits as commits
import engine.store.delta.direct_append as direct_append
import engine.store.delta.snapshot as delta
from engine import CommitConflictError, Message, Producer, Store, StoreError
from engine.model import SysFlag
from engine.protocol import record_size, tags_code
from engine.store import schemas
from engine.store.commit_log import CommitLogWriter
from engine.store.commit_log.hwm import read_hwm, recover_hwm_by_scan
from engine.store.commit_log.stamping import HighWaterMarks, PendingBatch, PendingMessage, stamp
from engine.store.commit_markers import BATCH_KEY
from engine.store.delta.direct_append import DIRECT_ENV, DirectAppender
from engine.store.delta.hostlock import LOCK_DIR, LOCK_ENV, HostLock
from engine.store.delta.log import read_versions
from engine.store.store import now_ms
from engine.store.table_properties import TXN_RETENTION
from tests.helpers import eventually, lock_waiters, versions


def _rows_with_versions(store: Store) -> list[dict[str, Any]]:
    latest = store.version(schemas.COMMIT_LOG)
    table = read_versions(store.uri(schemas.COMMIT_LOG), 0, latest, schemas.COMMIT_LOG_SCHEMA)
    return sorted(table.to_pylist(), key=lambda r: (r["_version"], r["physical_offset"]))


def assert_invariants(rows: list[dict[str, Any]]) -> None:
    """Physical offsets contiguous and increasing with commit order; queue offsets dense."""
    expected_physical = 0
    next_queue: dict[tuple[str, int], int] = defaultdict(int)
    for row in rows:
        assert row["physical_offset"] == expected_physical, row
        expected_physical += row["size"]
        key = (row["topic"], row["queue_id"])
        assert row["queue_offset"] == next_queue[key], row
        next_queue[key] += 1


def _pending(topic: str, qid: int, body: bytes) -> PendingMessage:
    return PendingMessage(topic=topic, queue_id=qid, body=body, uniq_key=body.hex())


@pytest.fixture(params=["direct", "delta-rs"])
def commit_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Writers made in the test commit directly, or (``MQ_DIRECT_APPEND=0``) through delta-rs."""
    monkeypatch.setenv(DIRECT_ENV, "1" if request.param == "direct" else "0")
    return str(request.param)


def _wrap_commit(
    monkeypatch: pytest.MonkeyPatch, path: str, wrap: Callable[[Callable[..., Any]], Any]
) -> None:
    """Replace the call that commits an append on ``path`` by ``wrap(original)``."""
    if path == "direct":
        monkeypatch.setattr(DirectAppender, "commit", wrap(DirectAppender.commit))
    else:
        monkeypatch.setattr(commits, "write_deltalake", wrap(write_deltalake))


def test_stale_writer_catches_up_before_stamping(store: Store, topic: str) -> None:
    a, b = CommitLogWriter(store), CommitLogWriter(store)
    a.append([_pending(topic, 0, b"a0")])  # b's snapshot is older than this once it loads
    b.append([_pending(topic, 0, b"b0")])
    a.append([_pending(topic, 0, b"a1")])  # a is stale now: it sees the newer commit first
    rows = _rows_with_versions(store)
    assert [r["body"] for r in rows] == [b"a0", b"b0", b"a1"]
    assert [r["queue_offset"] for r in rows] == [0, 1, 2]
    assert a.conflicts == 0
    assert_invariants(rows)


def _rival_commits_first(
    monkeypatch: pytest.MonkeyPatch, commit_path: str, rival: CommitLogWriter, topic: str
) -> None:
    """The next commit on ``commit_path`` finds that ``rival`` committed just before it (once)."""
    raced: list[bool] = []

    def rival_commits_first(original: Callable[..., Any]) -> Callable[..., Any]:
        def commit(*args: Any, **kwargs: Any) -> Any:
            if not raced:
                raced.append(True)
                rival.append([_pending(topic, 0, b"rival")])
            return original(*args, **kwargs)

        return commit

    _wrap_commit(monkeypatch, commit_path, rival_commits_first)


@pytest.mark.parametrize("host_lock", [True, False])
def test_writer_that_loses_the_race_to_commit_restamps(
    store: Store, topic: str, monkeypatch: pytest.MonkeyPatch, host_lock: bool, commit_path: str
) -> None:
    # A writer without the lock (another host, maintenance, MQ_SEQUENCER_LOCK=0) commits between
    # our catch-up and our commit: we lose the race, catch up and stamp again.
    a, rival = CommitLogWriter(store, host_lock=host_lock), CommitLogWriter(store, host_lock=False)
    a.append([_pending(topic, 0, b"a0")])
    _rival_commits_first(monkeypatch, commit_path, rival, topic)
    [stamped] = a.append([_pending(topic, 0, b"a1")])
    assert a.conflicts == 1
    assert a.direct == (commit_path == "direct")
    rows = _rows_with_versions(store)
    assert [r["body"] for r in rows] == [b"a0", b"rival", b"a1"]
    assert stamped.queue_offset == 2 and stamped.physical_offset == rows[2]["physical_offset"]
    assert_invariants(rows)


def test_a_producer_counts_the_races_its_sequencers_lost(
    store: Store, topic: str, monkeypatch: pytest.MonkeyPatch, commit_path: str
) -> None:
    producer, rival = Producer(store), CommitLogWriter(store, host_lock=False)
    producer.send(Message(topic, b"p0"), queue_id=0)
    assert producer.lost_races == 0
    _rival_commits_first(monkeypatch, commit_path, rival, topic)
    assert producer.send(Message(topic, b"p1"), queue_id=0).queue_offset == 2
    assert producer.lost_races == 1
    producer.close()


def test_writers_of_one_host_take_turns_on_the_lock(store: Store, topic: str) -> None:
    holder = HostLock(os.path.join(store.root, LOCK_DIR, "commit_log.lock"))
    assert holder.acquire()
    writer = CommitLogWriter(store)
    waiting = threading.Thread(target=writer.append, args=([_pending(topic, 0, b"x")],))
    waiting.start()
    waiting.join(0.5)
    assert waiting.is_alive()  # queued behind the holder
    assert store.version(schemas.COMMIT_LOG) == 0
    holder.release()
    waiting.join(30)
    assert not waiting.is_alive()
    assert store.version(schemas.COMMIT_LOG) == 1


def _open_descriptors(path: str) -> int:
    """This process's open descriptors of the file ``path`` (other threads' files do not count)."""
    opened = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # (one closed meanwhile)
            opened += os.readlink(f"/proc/self/fd/{fd}") == path
    return opened


def test_a_host_lock_keeps_one_descriptor_for_its_turns_and_lets_others_take_it_between(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / LOCK_DIR / "t.lock")
    mine, other = HostLock(path), HostLock(path)

    def held() -> bool:
        fd = os.open(path, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # (closing lets a lock taken here go)
        return False

    assert mine.acquire()
    mine.release()
    assert other.acquire()
    other.release()
    before = _open_descriptors(path)
    for _ in range(50):
        assert mine.acquire()
        assert held()
        mine.release()
        assert not held()  # really let go, although its descriptor stays open
        assert other.acquire()
        other.release()
    assert _open_descriptors(path) == before == 2  # each kept one, reused turn after turn
    mine.close()
    other.close()
    assert _open_descriptors(path) == 0
    dropped = HostLock(path)
    assert dropped.acquire()
    dropped.release()
    assert _open_descriptors(path) == 1
    del dropped  # a lock nobody holds any more closes its descriptor
    assert _open_descriptors(path) == 0


def test_a_host_lock_in_a_forked_process_opens_its_own_descriptor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lock = HostLock(str(tmp_path / LOCK_DIR / "t.lock"))
    assert lock.acquire()
    parents = lock._fd
    lock.release()
    monkeypatch.setattr("engine.store.delta.hostlock.os.getpid", lambda: -1)  # as in a fork's child
    assert lock.acquire()
    assert lock._fd is not None and lock._fd != parents  # the parent's open file is not shared
    lock.close()
    assert parents is not None
    os.close(parents)  # (the parent's, in this one process)


def test_a_stuck_lock_holder_delays_writers_only_up_to_the_lock_wait(store: Store, topic: str) -> None:
    holder = HostLock(os.path.join(store.root, LOCK_DIR, "commit_log.lock"))
    assert holder.acquire()  # and never lets go, as a stopped process
    writer = CommitLogWriter(store, lock_wait_s=0.2)
    results = [writer.append([_pending(topic, 0, f"{i}".encode())])[0].queue_offset for i in range(3)]
    assert results == [0, 1, 2]  # appended without the lock, optimistically
    holder.release()
    assert writer.append([_pending(topic, 0, b"locked again")])[0].queue_offset == 3
    assert_invariants(_rows_with_versions(store))


def test_a_stuck_lock_holder_is_waited_for_once_until_it_lets_go(tmp_path: Path) -> None:
    path = str(tmp_path / LOCK_DIR / "t.lock")
    holder, waiter = HostLock(path), HostLock(path, wait_s=0.1)
    assert holder.acquire()  # and stops, holding it
    assert [waiter.acquire() for _ in range(4)] == [False] * 4
    assert lock_waiters() == 1  # the first turn waited and gave up; the others went on at once
    holder.release()
    assert eventually(lambda: lock_waiters() == 0, timeout_s=30)  # it got the lock and let it go
    assert waiter.acquire()  # and turns wait again
    waiter.close()
    assert holder.acquire()
    holder.close()


def test_unusable_lock_file_falls_back_to_optimistic_sequencing(store: Store, topic: str) -> None:
    Path(store.root, LOCK_DIR).write_text("not a directory")
    writer = CommitLogWriter(store)
    assert [s.queue_offset for s in writer.append([_pending(topic, 0, b"x"), _pending(topic, 0, b"y")])] == [
        0,
        1,
    ]
    assert writer.append([_pending(topic, 0, b"z")])[0].queue_offset == 2


def test_every_pair_of_writers_in_lockstep(store: Store, topic: str) -> None:
    writers = [CommitLogWriter(store) for _ in range(3)]
    for w in writers:
        w.append([_pending(topic, 1, b"warm")])
    for round_ in range(5):
        for i, w in enumerate(writers):
            w.append([_pending(topic, 1, f"{round_}-{i}".encode()), _pending(topic, 2, b"x")])
    rows = _rows_with_versions(store)
    assert len(rows) == 3 + 5 * 3 * 2
    assert_invariants(rows)


def _producer_process(root: str, worker: int, count: int, lock: bool, out: Any) -> None:
    os.environ[LOCK_ENV] = "1" if lock else "0"
    store = Store.open(root)
    gave_up = retried = 0
    with Producer(store) as p:
        for i in range(count):
            batch = [Message("T", f"w{worker}-{i}-{j}".encode()) for j in range(3 if i % 5 == 4 else 1)]
            for _ in range(20):
                try:
                    p.send_batch(batch) if len(batch) > 1 else p.send(batch[0])
                    break
                except CommitConflictError:  # retryable: nothing was written
                    retried += 1
            else:
                gave_up += 1
        out.put({"gave_up": gave_up, "retried": retried, "conflicts": p.lost_races})


def _run_producers(store: Store, processes: int, count: int, lock: bool) -> list[dict[str, int]]:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_producer_process, args=(store.root, w, count, lock, out))
        for w in range(processes)
    ]
    for p in procs:
        p.start()
    reports = [out.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    rows = _rows_with_versions(store)
    bodies = Counter(r["body"] for r in rows)
    expected = {
        f"w{w}-{i}-{j}".encode()
        for w in range(processes)
        for i in range(count)
        for j in range(3 if i % 5 == 4 else 1)
    }
    assert set(bodies) == expected  # nothing lost
    assert max(bodies.values()) == 1  # nothing duplicated
    assert_invariants(rows)  # offsets dense, in commit order
    hwm = read_hwm(store.snapshot(schemas.COMMIT_LOG))
    assert sum(hwm.queues["T"]) == len(rows)
    return reports


@pytest.mark.slow
def test_eight_producer_processes_queue_on_the_lock_and_none_gives_up(store: Store, topic: str) -> None:
    reports = _run_producers(store, processes=8, count=30, lock=True)
    assert [r["gave_up"] for r in reports] == [0] * 8
    assert [r["retried"] for r in reports] == [0] * 8


@pytest.mark.slow
def test_eight_producer_processes_without_the_lock_take_turns_and_none_gives_up(
    store: Store, topic: str
) -> None:
    # Writers on different hosts: only the optimistic protocol and its pacing sequence them. No send
    # may exhaust max_commit_attempts (a CommitConflictError), and every invariant holds.
    reports = _run_producers(store, processes=8, count=10, lock=False)
    assert [(r["gave_up"], r["retried"]) for r in reports] == [(0, 0)] * 8


def test_a_writer_counts_as_rivals_the_writers_of_the_commits_it_missed(store: Store, topic: str) -> None:
    a, b, c = (CommitLogWriter(store, host_lock=False) for _ in range(3))
    a.append([_pending(topic, 0, b"a0")])
    b.append([_pending(topic, 0, b"b0")])
    c.append([_pending(topic, 0, b"c0")])
    b.append([_pending(topic, 0, b"b1")])
    a.append([_pending(topic, 0, b"a1")])  # catches up over b0, c0, b1
    assert a._pacer.rivals == 2
    newest_first = store.snapshot(schemas.COMMIT_LOG).recent_commit_infos(5)
    assert [sequencer._writer_of(info.get(BATCH_KEY)) for info in newest_first] == [
        w._writer_id for w in (a, b, c, b, a)
    ]
    assert_invariants(_rows_with_versions(store))


def test_lock_is_not_needed_for_correctness(store: Store, topic: str) -> None:
    # Lost races are retried by the sequencer (and, past max_commit_attempts, by the caller).
    reports = _run_producers(store, processes=4, count=20, lock=False)
    assert [r["gave_up"] for r in reports] == [0] * 4


def test_conflicts_exhausted_raise_retryable_error_and_write_nothing(
    store: Store, topic: str, monkeypatch: pytest.MonkeyPatch, commit_path: str
) -> None:
    def always_conflict(original: Callable[..., Any]) -> Callable[..., Any]:
        def commit(*args: Any, **kwargs: Any) -> None:
            if commit_path == "direct":
                raise CommitConflictError("version exists")
            raise CommitFailedError("version exists")

        return commit

    _wrap_commit(monkeypatch, commit_path, always_conflict)
    store = Store.open(store.root, config=store.config.replace(max_commit_attempts=3))
    before = versions(store)
    with pytest.raises(CommitConflictError) as info:
        CommitLogWriter(store).append([_pending(topic, 0, b"x")])
    assert info.value.retryable
    assert versions(store) == before


def test_io_error_is_a_failed_send_with_nothing_committed(
    store: Store, topic: str, monkeypatch: pytest.MonkeyPatch, commit_path: str
) -> None:
    def broken_disk(*args: Any, **kwargs: Any) -> None:
        raise OSError(5, "Input/output error")

    before = versions(store)
    with Producer(store) as p:
        if commit_path == "direct":
            monkeypatch.setattr(direct_append.os, "link", broken_disk)
        else:
            monkeypatch.setattr(commits, "write_deltalake", broken_disk)
        with pytest.raises(StoreError, match="nothing was stored"):
            p.send(Message(topic, b"x"))
        monkeypatch.undo()
        r = p.send(Message(topic, b"y"))  # writes resume
    assert versions(store)["commit_log"] == before["commit_log"] + 1
    assert (r.queue_offset, r.physical_offset) == (0, 0)


def test_marks_survive_a_commit_without_them(store: Store, topic: str) -> None:
    with Producer(store) as p:
        for i in range(4):
            p.send(Message(topic, f"{i}".encode()), queue_id=0)
    DeltaTable(store.uri(schemas.COMMIT_LOG)).optimize.compact()  # a commit with no mq.hwm
    with Producer(store) as p:
        r = p.send(Message(topic, b"after"), queue_id=0)
    assert r.queue_offset == 4
    dt = store.snapshot(schemas.COMMIT_LOG)
    assert recover_hwm_by_scan(dt) == read_hwm(dt)


def test_recover_marks_by_scan_on_empty_table(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "s")
    hwm = recover_hwm_by_scan(store.snapshot(schemas.COMMIT_LOG))
    assert (hwm.physical, hwm.queues) == (0, {})


def test_app_transaction_makes_a_re_put_exactly_once(store: Store, topic: str) -> None:
    w1, w2 = CommitLogWriter(store), CommitLogWriter(store)
    first = w1.append([_pending(topic, 0, b"due")], app_transactions={"mq.schedule.0": 0})
    assert len(first) == 1
    # A replay (or a second job instance with a stale snapshot) of the same progress writes nothing.
    assert w2.append([_pending(topic, 0, b"due")], app_transactions={"mq.schedule.0": 0}) == []
    assert w1.append([_pending(topic, 0, b"due")], app_transactions={"mq.schedule.0": 0}) == []
    assert len(w2.append([_pending(topic, 0, b"next")], app_transactions={"mq.schedule.0": 1})) == 1
    assert [r["body"] for r in _rows_with_versions(store)] == [b"due", b"next"]
    assert DeltaTable(store.uri(schemas.COMMIT_LOG)).transaction_version("mq.schedule.0") == 1


def test_progress_only_commit_records_app_version(store: Store) -> None:
    assert CommitLogWriter(store).append([], app_transactions={"mq.job": 3}) == []
    assert DeltaTable(store.uri(schemas.COMMIT_LOG)).transaction_version("mq.job") == 3


def _checkpoint_app_ids(uri: str) -> set[str]:
    [checkpoint] = Path(uri, "_delta_log").glob("*.checkpoint.parquet")
    return {t["appId"] for t in pq.read_table(checkpoint, columns=["txn"])["txn"].to_pylist() if t}


def test_transaction_guards_expire_after_the_retention_and_progress_markers_never(
    store: Store, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = store.uri(schemas.COMMIT_LOG)
    retention = DeltaTable(uri).metadata().configuration["delta.setTransactionRetentionDuration"]
    assert retention == TXN_RETENTION == "interval 7 days"
    writer = CommitLogWriter(store)
    eight_days_ago = now_ms() - 8 * 24 * 3600 * 1000
    with monkeypatch.context() as m:
        m.setattr(sequencer, "now_ms", lambda: eight_days_ago)
        writer.append([_pending(topic, 0, b"old decision")], app_transactions={"mq.tx.7": 0, "mq.job": 3})
    assert writer.append([_pending(topic, 0, b"decision")], app_transactions={"mq.tx.9": 0})
    # Within the retention a guard is exactly once: a second decider writes nothing.
    assert (
        CommitLogWriter(store).append([_pending(topic, 0, b"again")], app_transactions={"mq.tx.9": 0}) == []
    )
    fresh = DeltaTable(uri)
    assert fresh.transaction_version("mq.tx.7") is None  # expired
    assert fresh.transaction_version("mq.tx.9") == 0
    assert fresh.transaction_version("mq.job") == 3  # a job's progress never expires
    fresh.create_checkpoint()
    assert _checkpoint_app_ids(uri) == {"mq.tx.9", "mq.job"}
    assert DeltaTable(uri).transaction_version("mq.tx.7") is None
    assert [r["body"] for r in _rows_with_versions(store)] == [b"old decision", b"decision"]


def test_opening_an_older_store_adds_the_txn_retention_and_the_checkpoint_interval(tmp_path: Path) -> None:
    root = tmp_path / "s"
    Store.open(root)
    shutil.rmtree(root / schemas.COMMIT_LOG)  # a commit log created before the property existed
    DeltaTable.create(str(root / schemas.COMMIT_LOG), schemas.COMMIT_LOG_SCHEMA)
    shutil.rmtree(root / schemas.CONSUMER_OFFSET)  # and a table of another kind, from before the interval
    DeltaTable.create(str(root / schemas.CONSUMER_OFFSET), schemas.SCHEMAS[schemas.CONSUMER_OFFSET])
    store = Store.open(root)
    config = DeltaTable(store.uri(schemas.COMMIT_LOG)).metadata().configuration
    assert config["delta.setTransactionRetentionDuration"] == TXN_RETENTION
    assert config["delta.checkpointInterval"] == "100"  # the commit log's own interval
    offsets = DeltaTable(store.uri(schemas.CONSUMER_OFFSET)).metadata().configuration
    assert offsets["delta.checkpointInterval"] == "10"  # Delta's default interval, on every table


def test_pending_batch_columns_match_each_message(topic: str) -> None:
    messages = [
        PendingMessage(topic, 1, b"plain", "u0", tags="A"),
        PendingMessage(topic, 2, b"keyed", "u1", keys=("k",), properties={"KEYS": "k"}, born_ts_ms=5),
        PendingMessage(
            "SCHEDULE_TOPIC_XXXX", 2, b"later", "u2", delay_level=3, deliver_at_ms=99, tags_code=99
        ),
        PendingMessage(topic, 0, b"half", "u3", sys_flag=int(SysFlag.PREPARED), reconsume_times=2),
    ]
    batch = PendingBatch.of(messages)
    rows = batch.columns.to_pylist()
    assert [r["body"] for r in rows] == [m.body for m in messages]
    assert [r["size"] for r in rows] == [record_size(m.topic, len(m.body), m.properties) for m in messages]
    assert [r["tags_code"] for r in rows] == [tags_code("A"), 0, 99, 0]
    assert [r["keys"] for r in rows] == [[], ["k"], [], []]
    assert [dict(r["properties"]) for r in rows] == [{}, {"KEYS": "k"}, {}, {}]
    assert [(r["delay_level"], r["deliver_at_ms"]) for r in rows] == [
        (0, None),
        (0, None),
        (3, 99),
        (0, None),
    ]
    assert [(r["sys_flag"], r["reconsume_times"]) for r in rows] == [
        (0, 0),
        (0, 0),
        (0, 0),
        (int(SysFlag.PREPARED), 2),
    ]
    assert batch.dispatched == [True, True, True, False]
    table, results, after = stamp(batch, HighWaterMarks(), "AB" * 8, 1000)
    assert table.schema == schemas.COMMIT_LOG_SCHEMA
    assert table["born_ts_ms"].to_pylist() == [1000, 5, 1000, 1000]  # unset born times are the store time
    assert results.queue_offsets == [0, 0, 0, -1]
    assert results.uniq_keys == ["u0", "u1", "u2", "u3"]
    assert after.queues == {topic: {1: 1, 2: 1}, "SCHEDULE_TOPIC_XXXX": {2: 1}}  # only the queues written
    marks = HighWaterMarks()
    marks.apply(after)
    assert marks.queues == {topic: [0, 1, 1], "SCHEDULE_TOPIC_XXXX": [0, 0, 1]}


def _assorted(topic: str, n: int) -> list[PendingMessage]:
    """``n`` messages of every kind a commit holds: plain, keyed, with properties (some sharing one
    mapping), delayed, half, born unset, tags unset or overridden, of several queues and topics."""
    shared = {"a": "1", "b": "2"}
    kinds = [
        lambda i: PendingMessage(topic, i % 3, b"plain%d" % i, f"p{i}", tags="A", born_ts_ms=7),
        lambda i: PendingMessage(topic, 1, b"k", f"k{i}", keys=("k", "j"), properties={"KEYS": "k j"}),
        lambda i: PendingMessage(topic, 2, b"s" * i, f"s{i}", tags=None, properties=shared, born_ts_ms=9),
        lambda i: PendingMessage(
            "SCHEDULE_TOPIC_XXXX", 2, b"later", f"d{i}", delay_level=3, deliver_at_ms=99, tags_code=99
        ),
        lambda i: PendingMessage(
            topic, 0, b"half", f"h{i}", sys_flag=int(SysFlag.PREPARED), reconsume_times=2
        ),
        lambda i: PendingMessage("other", i % 2, "ü".encode() * i, f"o{i}", tags="é", properties={"é": "ü"}),
    ]
    return [kinds[i % len(kinds)](i) for i in range(n)]


@pytest.mark.parametrize("rows", [1, 6, 40, 257])
def test_rows_and_columns_stamp_the_same_commit(
    rows: int, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A batch given one by one is stamped row-wise up to ROW_BATCH_ROWS messages and column-wise
    # above: the commit's rows, the results and the marks are the same either way.
    import engine.store.commit_log.stamping as stamping

    messages = _assorted(topic, rows)
    marks = HighWaterMarks()
    marks.apply(stamp([PendingMessage(topic, 1, b"x", "seed")], marks, "AB" * 8, 1)[2])
    found = []
    for limit in (10**9, 0):  # rows always, columns always
        monkeypatch.setattr(stamping, "ROW_BATCH_ROWS", limit)
        batch = PendingBatch.of(messages)
        assert (batch.offset_free is None) == (limit > 0)
        table, results, delta = stamp(batch, marks, "AB" * 8, 1000)
        assert table.schema.equals(schemas.COMMIT_LOG_SCHEMA)
        found.append((table, results, delta, batch.columns, batch.take([rows - 1, 0]).columns))
    (rows_table, *rest), (columns_table, *others) = found
    assert rows_table.equals(columns_table), (rows_table.to_pylist()[:2], columns_table.to_pylist()[:2])
    assert rest[:2] == others[:2]
    assert rest[2].equals(others[2]) and rest[3].equals(others[3])  # columns built on demand
    assert rows_table["born_ts_ms"].to_pylist()[:3] == [7, 1000, 9][:rows]  # unset born times: the store's


@pytest.mark.parametrize("rows", [3, 40])
def test_queue_offsets_are_the_same_in_a_loop_and_in_columns(
    rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Few rows take a loop, many the columns (COLUMNAR_OFFSETS_ROWS): both give each queue's rows
    # consecutive offsets in input order from the queue's next one, and the same marks.
    import engine.store.commit_log.stamping as stamping

    marks = HighWaterMarks()
    marks.apply(stamp([PendingMessage("t", 1, b"x", "seed")], marks, "AB" * 8, 1)[2])
    monkeypatch.setattr(stamping, "ROW_BATCH_ROWS", 0)  # in columns: rows always take the loop
    batch = PendingBatch.of(
        [PendingMessage("t" if i % 3 else "u", i % 4, b"x", f"u{i}") for i in range(rows)]
    )
    assert batch.offset_free is not None
    found = []
    for threshold in (0, 10**9):  # columns always, a loop always
        monkeypatch.setattr(stamping, "COLUMNAR_OFFSETS_ROWS", threshold)
        _, results, delta = stamp(batch, marks, "AB" * 8, 1000)
        found.append((results.queue_offsets, delta.queues))
    assert found[0] == found[1]
    offsets, queues = found[0]
    expected, seen = [], {("t", 1): 1}
    for i in range(rows):
        queue = ("t" if i % 3 else "u", i % 4)
        expected.append(seen.get(queue, 0))
        seen[queue] = expected[-1] + 1
    assert offsets == expected
    assert queues == {t: {q: n for (tt, q), n in seen.items() if tt == t} for t in ("t", "u")}


def _count_commit_log_opens(store: Store, monkeypatch: pytest.MonkeyPatch, fail_at: int = -1) -> list[int]:
    """Spy on the store's commit-log handle opens; the ``fail_at``-th one (0-based) fails."""
    assert store.store_id  # cached from here on: its first look-up opens the commit log too
    opens: list[int] = []
    real_open = store.snapshot

    def spy(name: str, version: int | None = None) -> Any:
        if name == schemas.COMMIT_LOG:
            opens.append(len(opens))
            if len(opens) - 1 == fail_at:
                raise StoreError("table cannot be loaded: injected", table=name)
        return real_open(name, version)

    monkeypatch.setattr(store, "snapshot", spy)
    return opens


def test_writer_renews_its_handle_as_it_ages_and_keeps_offsets_dense(
    store: Store, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A delta-rs handle slows down with every version it moves on by: the writer reopens it.
    monkeypatch.setattr(delta, "RENEW_HANDLE_COMMITS", 3)
    writer, other = CommitLogWriter(store, direct=False), CommitLogWriter(store, direct=False)
    opens = _count_commit_log_opens(store, monkeypatch)
    stamped = []
    for i in range(7):
        stamped += writer.append([_pending(topic, 0, f"w{i}".encode())])
        other.append([_pending(topic, 1, f"o{i}".encode())])  # moves the log on behind the writer
    # Writer and other each open once, then renew every 3 versions their handles move on by.
    assert len(opens) >= 2 + 4
    assert [s.queue_offset for s in stamped] == list(range(7))
    assert [s.version for s in stamped] == [1 + 2 * i for i in range(7)]
    assert_invariants(_rows_with_versions(store))


def test_failed_handle_renewal_keeps_the_committed_batch_and_reopens_on_the_next_append(
    store: Store, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(delta, "RENEW_HANDLE_COMMITS", 2)
    writer = CommitLogWriter(store, direct=False)
    opens = _count_commit_log_opens(store, monkeypatch, fail_at=1)  # the first renewal fails
    results = [writer.append([_pending(topic, 0, f"{i}".encode())])[0] for i in range(4)]
    assert len(opens) >= 3  # first open, the failed renewal, the reopen on the next append
    assert [r.queue_offset for r in results] == [0, 1, 2, 3]
    assert [r.version for r in results] == [1, 2, 3, 4]
    assert store.version(schemas.COMMIT_LOG) == 4
    assert_invariants(_rows_with_versions(store))
