"""Commit-log appends committed by the engine itself (engine.store.delta.direct_append): what Delta readers
see of them, put-if-absent, and when a writer must not or cannot append directly."""

from __future__ import annotations

import errno
import json
import os
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

import engine.store.commit_log.writer as writer_module
import engine.store.delta.direct_append as direct_append
from engine import CommitConflictError, CommitTruncatedError, Store
from engine.store import schemas
from engine.store.commit_log import CommitLogWriter
from engine.store.commit_log import saved_marks as marks_snapshots
from engine.store.commit_log.hwm import read_hwm
from engine.store.commit_log.stamping import PendingMessage
from engine.store.delta import background_checkpoints, open_snapshot
from engine.store.delta.data_files import MAX_STAT_STRING, file_stats
from engine.store.delta.direct_append import blocker, direct_appender, plain_info_line
from engine.store.delta.log import read_versions


def _pending(topic: str, qid: int, body: bytes, tags: str | None = None) -> PendingMessage:
    return PendingMessage(topic=topic, queue_id=qid, body=body, uniq_key=body.hex(), tags=tags)


def _log(store: Store) -> Path:
    return Path(store.uri(schemas.COMMIT_LOG)) / "_delta_log"


def _assert_dense(store: Store) -> None:
    """Physical offsets contiguous in commit order, queue offsets dense per queue."""
    latest = store.version(schemas.COMMIT_LOG)
    table = read_versions(store.uri(schemas.COMMIT_LOG), 0, latest, schemas.COMMIT_LOG_SCHEMA)
    rows = sorted(table.to_pylist(), key=lambda r: (r["_version"], r["physical_offset"]))
    physical, queues = 0, defaultdict(int)
    for row in rows:
        assert row["physical_offset"] == physical, row
        physical += row["size"]
        assert row["queue_offset"] == queues[row["topic"], row["queue_id"]], row
        queues[row["topic"], row["queue_id"]] += 1


def test_a_direct_append_carries_the_statistics_delta_readers_skip_files_by(store: Store, topic: str) -> None:
    writer = CommitLogWriter(store)
    writer.append([_pending(topic, 0, b"a", "TagA"), _pending(topic, 0, b"b")])
    writer.append([_pending(topic, 1, b"c", "TagC")])
    assert writer.direct
    dt = DeltaTable(store.uri(schemas.COMMIT_LOG))
    actions = pa.table(dt.get_add_actions(flatten=True)).to_pylist()
    one, two = sorted(actions, key=lambda a: a["num_records"])
    assert (two["num_records"], two["min.queue_offset"], two["max.queue_offset"]) == (2, 0, 1)
    assert (two["min.tags"], two["max.tags"], two["null_count.tags"]) == ("TagA", "TagA", 1)
    assert (one["min.queue_id"], one["max.queue_id"]) == (1, 1)
    assert one["min.physical_offset"] > two["max.physical_offset"]
    assert not [k for k in one if k.endswith((".body", ".keys"))]  # no statistics for bodies and lists
    # delta-rs prunes files by them: a predicate on queue_id leaves the second file alone
    pruned = store.snapshot(schemas.COMMIT_LOG).dataset("queue_id = 1")
    assert len(list(pruned.get_fragments())) == 1
    assert pruned.to_table().column("body").to_pylist() == [b"c"]
    _assert_dense(store)


def test_a_file_of_one_row_group_is_written_plain_and_a_larger_one_with_dictionaries_and_statistics(
    store: Store, topic: str
) -> None:
    import pyarrow.parquet as pq

    writer = CommitLogWriter(store)
    for rows in (direct_append.PLAIN_FILE_ROWS, direct_append.PLAIN_FILE_ROWS + 1):
        writer.append([_pending(topic, 0, f"m{i}".encode(), "TagA") for i in range(rows)])
    assert writer.direct
    files = {}
    for add in pa.table(DeltaTable(store.uri(schemas.COMMIT_LOG)).get_add_actions(flatten=True)).to_pylist():
        meta = pq.ParquetFile(os.path.join(store.uri(schemas.COMMIT_LOG), add["path"])).metadata
        files[add["num_records"]] = [meta.row_group(g).column(c) for g in range(meta.num_row_groups)
                                     for c in range(meta.num_columns)]  # fmt: skip
    plain, encoded = files[direct_append.PLAIN_FILE_ROWS], files[direct_append.PLAIN_FILE_ROWS + 1]
    assert not any(c.is_stats_set or c.has_dictionary_page for c in plain)  # the add's stats suffice
    topics = [c for c in encoded if c.path_in_schema == "topic"]
    assert len(topics) == 2 and all(c.is_stats_set and c.has_dictionary_page for c in topics)  # 2 groups
    assert not any(c.is_stats_set for c in encoded if c.path_in_schema == "body")
    _assert_dense(store)


@pytest.mark.parametrize("in_memory_bytes", [0, direct_append.IN_MEMORY_FILE_BYTES])
def test_a_data_file_made_in_memory_or_streamed_holds_the_rows_and_its_size_is_the_files(
    store: Store, topic: str, monkeypatch: pytest.MonkeyPatch, in_memory_bytes: int
) -> None:
    import pyarrow.parquet as pq

    monkeypatch.setattr(direct_append, "IN_MEMORY_FILE_BYTES", in_memory_bytes)
    writer = CommitLogWriter(store)
    sent = [_pending(topic, i % 3, f"m{i}".encode() * 50, "TagA") for i in range(300)]
    writer.append(sent)
    assert writer.direct
    (add,) = pa.table(DeltaTable(store.uri(schemas.COMMIT_LOG)).get_add_actions(flatten=True)).to_pylist()
    path = os.path.join(store.uri(schemas.COMMIT_LOG), add["path"])
    assert add["size_bytes"] == os.path.getsize(path)
    assert pq.read_table(path).column("body").to_pylist() == [m.body for m in sent]
    assert not [p.name for p in Path(path).parent.iterdir() if p.name.startswith(".")]  # nothing staged
    _assert_dense(store)


def test_file_stats_count_nulls_and_leave_out_long_strings_and_nested_columns() -> None:
    rows = pa.table(
        {
            "n": pa.array([3, None, 1], pa.int64()),
            "s": pa.array(["b", "a", None]),
            "long": pa.array(["x" * (MAX_STAT_STRING + 1), "y", "z"]),
            "none": pa.array([None, None, None], pa.string()),
            "l": pa.array([["a"], [], None], pa.list_(pa.string())),
        }
    )
    stats = json.loads(file_stats(rows, ("n", "s", "long", "none", "l")))
    assert stats["numRecords"] == 3
    assert stats["minValues"] == {"n": 1, "s": "a"} and stats["maxValues"] == {"n": 3, "s": "b"}
    assert stats["nullCount"] == {"n": 1, "s": 1, "long": 0, "none": 3}  # none for lists, as Delta
    big = pa.table({"n": pa.array(range(1000), pa.int64())})  # the vectorised path gives the same
    assert json.loads(file_stats(big, ("n",)))["minValues"] == {"n": 0}
    assert json.loads(file_stats(big, ("n",)))["maxValues"] == {"n": 999}
    assert json.loads(file_stats(rows, 2))["minValues"] == {"n": 1, "s": "a"}  # the first 2 leaves
    many = pa.concat_tables([rows] * 30)  # above the small-table size: the same stats from kernels
    wide = json.loads(file_stats(many, ("n", "s", "long", "none", "l")))
    assert wide["nullCount"] == {k: v * 30 for k, v in stats["nullCount"].items()}
    assert (wide["minValues"], wide["maxValues"]) == (stats["minValues"], stats["maxValues"])
    # a schema of the same names and other types has a plan of its own
    other = pa.table({"n": pa.array(["9", "10"]), "s": pa.array([b"x", b"y"])})
    again = json.loads(file_stats(other, ("n", "s", "long", "none", "l")))
    assert again["minValues"] == {"n": "10"} and again["nullCount"] == {"n": 0, "s": 0}


def test_a_taken_version_is_a_conflict_and_leaves_neither_a_commit_nor_a_temporary_file(store: Store) -> None:
    appender = direct_appender(store.snapshot(schemas.COMMIT_LOG), schemas.COMMIT_LOG_SCHEMA)
    assert appender is not None
    before = sorted(os.listdir(_log(store)))
    add = appender.write_file(schemas.COMMIT_LOG_SCHEMA.empty_table())
    with pytest.raises(CommitConflictError) as info:
        appender.commit(0, add, {})  # version 0 is the table's creation
    assert info.value.retryable
    assert sorted(os.listdir(_log(store))) == before
    appender.commit(1, add, {"mq.test": "x"})
    assert open_snapshot(store.uri(schemas.COMMIT_LOG)).commit_info(1)["mq.test"] == "x"


@pytest.mark.parametrize("unnamed", [True, False], ids=["unnamed-file", "named-staging-file"])
def test_a_commit_file_is_linked_in_whole_and_no_staging_file_stays(
    store: Store, topic: str, monkeypatch: pytest.MonkeyPatch, unnamed: bool
) -> None:
    monkeypatch.setattr(direct_append, "_unnamed_files", unnamed)
    names: list[str] = []
    real_link = os.link

    def seen_link(source: str, target: str, **kwargs: Any) -> None:
        names.append(source)
        real_link(source, target, **kwargs)

    monkeypatch.setattr(direct_append.os, "link", seen_link)
    writer = CommitLogWriter(store)
    for body in (b"a", b"b"):
        writer.append([_pending(topic, 0, body)])
    monkeypatch.undo()
    # linked from the open file (/proc/self/fd/N) or from its staging name, which is then removed
    assert [n.startswith("/proc/self/fd/") for n in names] == [unnamed, unnamed]
    assert not list(_log(store).glob("_commit_*"))
    assert [r["body"] for r in read_versions(store.uri(schemas.COMMIT_LOG), 1, 2, schemas.COMMIT_LOG_SCHEMA)
            .to_pylist()] == [b"a", b"b"]  # fmt: skip


def test_a_file_system_without_unnamed_files_falls_back_to_a_staging_name(
    store: Store, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_open = os.open

    def no_tmpfile(path: str, flags: int, *args: Any, **kwargs: Any) -> int:
        if flags & os.O_TMPFILE == os.O_TMPFILE:
            raise OSError(errno.EOPNOTSUPP, "Operation not supported", path)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(direct_append, "_unnamed_files", True)
    monkeypatch.setattr(direct_append.os, "open", no_tmpfile)
    writer = CommitLogWriter(store)
    [stamped] = writer.append([_pending(topic, 0, b"x")])
    assert stamped.version == 1 and writer.direct
    assert direct_append._unnamed_files is False  # asked once per process
    monkeypatch.undo()
    assert sorted(os.listdir(_log(store)))[-1] == f"{1:020d}.json"
    assert not list(_log(store).glob("_commit_*"))


def test_a_direct_commit_cut_at_a_line_break_is_detected(store: Store, topic: str) -> None:
    CommitLogWriter(store).append([_pending(topic, 0, b"x")])
    path = _log(store) / f"{1:020d}.json"
    first_line = path.read_text().splitlines()[0]
    path.write_text(first_line + "\n")  # the add action is gone, the rest still parses
    appender = direct_appender(store.snapshot(schemas.COMMIT_LOG, 0), schemas.COMMIT_LOG_SCHEMA)
    assert appender is not None
    with pytest.raises(CommitTruncatedError):
        appender.read_commit(1)


def test_a_direct_commit_is_read_without_parsing_and_no_cut_of_it_passes_as_whole(
    store: Store, topic: str
) -> None:
    writer = CommitLogWriter(store)
    writer.append([_pending(topic, 0, b"x", "TagX")])
    path = _log(store) / f"{1:020d}.json"
    text = path.read_text()
    line = plain_info_line(text)
    assert line == text.splitlines()[0]
    appender = direct_appender(store.snapshot(schemas.COMMIT_LOG, 0), schemas.COMMIT_LOG_SCHEMA)
    assert appender is not None
    commit = appender.read_commit(1)
    assert commit is not None and not commit.changes_table
    parsed = json.loads(line)["commitInfo"]
    assert commit.batch_id == parsed["mq.batch"]  # read from the line, before any parse
    assert dict(commit.commit_info) == parsed
    # every shorter prefix of the file, cut mid-line or at the line break, is parsed whole (and fails)
    assert all(plain_info_line(text[:cut]) is None for cut in range(len(text)))
    # a commit written by delta-rs, or one holding more than one add, is parsed whole too
    DeltaTable(store.uri(schemas.COMMIT_LOG)).alter.set_table_properties(
        {"delta.logRetentionDuration": "interval 31 days"}
    )
    assert plain_info_line((_log(store) / f"{2:020d}.json").read_text()) is None
    assert plain_info_line(text + "\n" + text.splitlines()[1]) is None
    commit = appender.read_commit(2)
    assert commit is not None and commit.changes_table  # a metaData action


def _table(path: Path, schema: pa.Schema, **kwargs: Any) -> Any:
    write_deltalake(str(path), schema.empty_table(), **kwargs)
    return open_snapshot(str(path))


def test_tables_that_ask_more_than_a_blind_append_are_refused(tmp_path: Path, store: Store) -> None:
    schema = pa.schema([pa.field("k", pa.string(), nullable=False), pa.field("v", pa.int64())])
    assert blocker(_table(tmp_path / "plain", schema), schema) is None
    other = _table(tmp_path / "plain2", schema)
    assert blocker(other, schemas.COMMIT_LOG_SCHEMA) == "its schema is not the rows' schema"
    assert blocker(_table(tmp_path / "parted", schema, partition_by=["k"]), schema) == "partitioned"
    DeltaTable(str(tmp_path / "plain")).alter.add_constraint({"positive": "v > 0"})  # writer version 3
    reason = blocker(open_snapshot(str(tmp_path / "plain")), schema)
    assert reason is not None and "protocol" in reason
    assert direct_appender(open_snapshot(str(tmp_path / "plain")), schema) is None


def test_a_writer_goes_through_delta_rs_once_the_table_asks_more(store: Store, topic: str) -> None:
    writer = CommitLogWriter(store)
    writer.append([_pending(topic, 0, b"direct")])
    assert writer.direct
    DeltaTable(store.uri(schemas.COMMIT_LOG)).alter.add_constraint({"sized": "size > 0"})
    [after] = writer.append([_pending(topic, 0, b"through delta-rs")])
    assert not writer.direct and after.queue_offset == 1
    assert DeltaTable(store.uri(schemas.COMMIT_LOG)).protocol().min_writer_version >= 3
    _assert_dense(store)


def test_without_hard_links_a_writer_goes_through_delta_rs(
    store: Store, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_links(src: str, dst: str, **kwargs: Any) -> None:
        raise OSError(errno.EPERM, "Operation not permitted")

    writer = CommitLogWriter(store)
    monkeypatch.setattr(direct_append.os, "link", no_links)
    [stamped] = writer.append([_pending(topic, 0, b"x")])
    assert not writer.direct and (stamped.version, stamped.queue_offset) == (1, 0)
    monkeypatch.undo()
    assert writer.append([_pending(topic, 0, b"y")])[0].queue_offset == 1
    assert not writer.direct  # it stays with delta-rs
    _assert_dense(store)


def test_an_idle_writer_whose_next_commit_was_cleaned_up_does_not_commit_behind_the_log(
    store: Store, topic: str
) -> None:
    idle, busy = CommitLogWriter(store, host_lock=False), CommitLogWriter(store, host_lock=False)
    idle.append([_pending(topic, 0, b"first")])  # at version 1
    for i in range(104):
        busy.append([_pending(topic, 0, b"%d" % i)])  # checkpoint at 100 (the commit log's interval)
    assert background_checkpoints.wait(60)  # written off the commit path
    assert (_log(store) / f"{100:020d}.checkpoint.parquet").exists()
    for v in range(2, 100):  # what log cleanup removes once they are past the log retention
        (_log(store) / f"{v:020d}.json").unlink()
    [stamped] = idle.append([_pending(topic, 0, b"late")])
    assert stamped.version == 106 and stamped.queue_offset == 105
    assert not (_log(store) / f"{2:020d}.json").exists()
    assert DeltaTable(store.uri(schemas.COMMIT_LOG)).version() == 106


def test_the_writer_checkpoints_at_the_interval_with_the_marks_saved_first(store: Store, topic: str) -> None:
    writer = CommitLogWriter(store)
    for i in range(100):
        writer.append([_pending(topic, i % 2, b"%d" % i)])
    assert writer.direct
    assert background_checkpoints.wait(60)
    assert json.loads((_log(store) / "_last_checkpoint").read_text())["version"] == 100
    saved = marks_snapshots.load(store.uri(schemas.COMMIT_LOG), None, 100)
    assert saved is not None and saved[0] == 100
    assert saved[1].to_json() == read_hwm(store.snapshot(schemas.COMMIT_LOG)).to_json()
    assert DeltaTable(store.uri(schemas.COMMIT_LOG)).to_pyarrow_table().num_rows == 100


def test_a_checkpoint_due_too_soon_after_the_last_one_is_left_out(store: Store, topic: str) -> None:
    writer = CommitLogWriter(store)
    for i in range(100):
        writer.append([_pending(topic, 0, b"%d" % i)])
    assert background_checkpoints.wait(60)
    assert writer._last_checkpoint is not None and writer._last_checkpoint[1] > 0  # timed
    # The one at 100 began now and took an hour: the thread would spend it all on the commit log.
    writer._last_checkpoint = (time.monotonic(), 3600.0)
    for i in range(100):
        writer.append([_pending(topic, 0, b"b%d" % i)])
    assert background_checkpoints.wait(60)
    assert writer.checkpoints_left_out == 1
    assert json.loads((_log(store) / "_last_checkpoint").read_text())["version"] == 100
    # Long enough ago for its duration: the next interval's is written.
    writer._last_checkpoint = (time.monotonic() - 2 / writer_module.CHECKPOINT_SHARE, 1.0)
    for i in range(100):
        writer.append([_pending(topic, 0, b"c%d" % i)])
    assert background_checkpoints.wait(60)
    assert writer.checkpoints_left_out == 1
    assert json.loads((_log(store) / "_last_checkpoint").read_text())["version"] == 300
    assert DeltaTable(store.uri(schemas.COMMIT_LOG)).to_pyarrow_table().num_rows == 300
    _assert_dense(store)


def test_the_commit_that_makes_a_checkpoint_due_does_not_wait_for_it(
    store: Store, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    release, started = threading.Event(), threading.Event()
    real = writer_module.checkpoint_commit_log

    def slow_checkpoint(*args: Any, **kwargs: Any) -> None:
        started.set()
        assert release.wait(60)
        real(*args, **kwargs)

    monkeypatch.setattr(writer_module, "checkpoint_commit_log", slow_checkpoint)
    writer = CommitLogWriter(store)
    for i in range(100):
        writer.append([_pending(topic, 0, b"%d" % i)])
    assert started.wait(60)  # the checkpoint of version 100 is being written ...
    [later] = writer.append([_pending(topic, 0, b"meanwhile")])  # ... and sends go on
    assert (later.version, later.queue_offset) == (101, 100)
    assert not (_log(store) / "_last_checkpoint").exists()
    release.set()
    assert background_checkpoints.wait(60)
    assert json.loads((_log(store) / "_last_checkpoint").read_text())["version"] == 100
    _assert_dense(store)


def test_a_retried_link_that_finds_its_own_commit_is_acknowledged_once(
    store: Store, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # NFS retransmits a LINK whose reply was lost and answers EEXIST: the commit is the writer's own.
    real_link = os.link

    def made_then_exists(source: str, target: str, **kwargs: Any) -> None:
        real_link(source, target, **kwargs)
        raise FileExistsError(errno.EEXIST, "File exists", target)

    writer = CommitLogWriter(store)
    monkeypatch.setattr(direct_append.os, "link", made_then_exists)
    [stamped] = writer.append([_pending(topic, 0, b"once")])
    monkeypatch.undo()
    assert (stamped.version, stamped.queue_offset, writer.conflicts) == (1, 0, 0)
    assert writer.append([_pending(topic, 0, b"next")])[0].queue_offset == 1
    assert store.version(schemas.COMMIT_LOG) == 2
    _assert_dense(store)


def test_direct_and_delta_rs_writers_interleave_on_one_log(store: Store, topic: str) -> None:
    direct, through = (
        CommitLogWriter(store, host_lock=False),
        CommitLogWriter(store, host_lock=False, direct=False),
    )
    for i in range(12):  # past a checkpoint of neither kind: both follow each other's commits
        writer = direct if i % 3 else through
        [stamped] = writer.append([_pending(topic, i % 2, b"%d" % i)])
        assert stamped.version == i + 1
    guarded = direct.append([_pending(topic, 0, b"guarded")], app_transactions={"mq.test": 1})
    assert guarded[0].version == 13  # an append with an app transaction goes through delta-rs
    assert direct.append([_pending(topic, 0, b"guarded again")], app_transactions={"mq.test": 1}) == []
    assert direct.direct and not through.direct
    assert store.app_version(schemas.COMMIT_LOG, "mq.test") == 1
    _assert_dense(store)
