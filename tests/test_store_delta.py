"""The delta-rs mechanics of engine/store: snapshots, commits of exactly the next version, markers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake.exceptions import CommitFailedError, DeltaError

import engine.store.delta.commits as commits
import engine.store.delta.snapshot as delta
from engine import CommitConflictError, CommitStateUnknownError, Message, Producer, Store, StoreError
from engine.errors import TableMissingError
from engine.store import schemas
from engine.store.commit_log.marks import MarksDelta
from engine.store.commit_markers import (
    CQ_KEY,
    EXPIRING_APP_PREFIX,
    HWM_KEY,
    MARKERS,
    MARKS_KEY,
    PULL_LOG_MARKS_KEY,
    carried_markers,
    transaction_app,
)
from engine.store.delta import local_path, open_snapshot
from engine.store.delta.commits import commit_next
from engine.store.table_properties import CHECKPOINT_INTERVAL
from tests.helpers import age_and_clean_log
from tests.raw_delta import raw_table

_ROW = {"group": "g", "topic": "T", "queue_id": 0, "offset": 0, "ts_ms": 0, "consumer_id": ""}


def _offsets(n: int, start: int = 0) -> pa.Table:
    rows = [dict(_ROW, offset=start + i, ts_ms=start + i) for i in range(n)]
    return pa.Table.from_pylist(rows, schema=schemas.CONSUMER_OFFSET_SCHEMA)


def test_commit_next_lands_exactly_on_the_next_version_with_its_markers_and_app_version(store: Store) -> None:
    snap = store.snapshot(schemas.CONSUMER_OFFSET)
    base = snap.version()
    version = commit_next(
        snap,
        rows=_offsets(2),
        transactions=delta.app_transactions({"mq.test": 7}),
        custom_metadata={"mq.k": "v"},
    )
    assert version == base + 1 == snap.version()
    assert snap.app_version("mq.test") == 7
    assert snap.app_version("mq.never") == -1
    assert snap.commit_value("mq.k") == "v"
    assert store.read(schemas.CONSUMER_OFFSET)["offset"].to_pylist() == [0, 1]


def test_commit_next_on_a_stale_snapshot_is_a_conflict_and_writes_nothing(store: Store) -> None:
    stale = store.snapshot(schemas.CONSUMER_OFFSET)
    commit_next(store.snapshot(schemas.CONSUMER_OFFSET), rows=_offsets(1))  # another writer wins
    before = store.version(schemas.CONSUMER_OFFSET)
    with pytest.raises(CommitConflictError) as caught:
        commit_next(stale, rows=_offsets(1, start=5))
    assert caught.value.retryable
    assert store.version(schemas.CONSUMER_OFFSET) == before
    assert store.read(schemas.CONSUMER_OFFSET)["offset"].to_pylist() == [0]


def test_a_commit_of_markers_only_adds_no_rows(store: Store) -> None:
    snap = store.snapshot(schemas.PULL_LOG)
    version = commit_next(snap, custom_metadata={"mq.only": "1"})
    assert store.snapshot(schemas.PULL_LOG).commit_value("mq.only") == "1"
    assert version == store.version(schemas.PULL_LOG)
    assert store.read(schemas.PULL_LOG).num_rows == 0


@pytest.mark.parametrize(
    ("on_error", "expected"), [("failed", StoreError), ("unknown", CommitStateUnknownError)]
)
def test_an_io_failure_is_failed_or_unknown_as_the_caller_says(
    store: Store, monkeypatch: pytest.MonkeyPatch, on_error: Any, expected: type[Exception]
) -> None:
    def broken(*args: Any, **kwargs: Any) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(commits, "write_deltalake", broken)
    with pytest.raises(expected) as caught:
        commit_next(store.snapshot(schemas.CONSUMER_OFFSET), rows=_offsets(1), on_error=on_error)
    assert not isinstance(caught.value, CommitStateUnknownError) or on_error == "unknown"
    assert caught.value.table == schemas.CONSUMER_OFFSET


def test_delta_errors_map_onto_the_engine_errors(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    def lost(*args: Any, **kwargs: Any) -> None:
        raise CommitFailedError("version 1 exists")

    def broken(*args: Any, **kwargs: Any) -> None:
        raise DeltaError("object store unreachable")

    monkeypatch.setattr(commits, "write_deltalake", lost)
    with pytest.raises(CommitConflictError):
        commit_next(store.snapshot(schemas.CONSUMER_OFFSET), rows=_offsets(1))
    monkeypatch.setattr(commits, "write_deltalake", broken)
    with pytest.raises(StoreError, match="unreachable"):
        commit_next(store.snapshot(schemas.CONSUMER_OFFSET), rows=_offsets(1))


def test_ready_actions_commit_only_on_exactly_the_next_version(store: Store) -> None:
    with pytest.raises(ValueError, match="max_retries=0"):
        commit_next(store.snapshot(schemas.INDEX), actions=[object()], max_retries=3)  # type: ignore[list-item]


def test_a_stale_snapshot_finds_markers_by_exact_version(store: Store, topic: str) -> None:
    with Producer(store) as producer:
        producer.send(Message(topic, b"a"), queue_id=0)
        stale = store.snapshot(schemas.COMMIT_LOG)
        producer.send(Message(topic, b"b"), queue_id=0)
    found = stale.find_commit_value(MARKS_KEY)
    assert found is not None and found[0] == stale.version()
    assert MarksDelta.from_compact_json(found[1])[0].queues[topic] == {0: 1}  # its version's, not newer
    fresh = store.snapshot(schemas.COMMIT_LOG)
    assert fresh.version() == stale.version() + 1 and fresh.moved_since_open == 0
    assert stale.refresh().version() == fresh.version() and stale.moved_since_open == 1


def test_a_snapshot_lists_its_live_files_with_their_column_ranges(store: Store, topic: str) -> None:
    with Producer(store) as producer:
        for body in (b"a", b"bb", b"ccc"):
            producer.send(Message(topic, body), queue_id=0)
    snap = store.snapshot(schemas.COMMIT_LOG)
    files = snap.files("physical_offset")
    assert len(files) == 3 and set(snap.paths()) == snap.live_paths() == {f.path for f in files}
    assert all(f.rows == 1 and f.size > 0 and f.lo == f.hi for f in files)
    assert snap.column_max("physical_offset") == max(f.hi for f in files if f.hi is not None)
    assert snap.column_max("no_such_column") == -1
    # The first 8 columns and both times (delta.dataSkippingStatsColumns wins over the count).
    assert snap.indexed_columns() == (*schemas.COMMIT_LOG_SCHEMA.names[:8], "born_ts_ms", "store_ts_ms")
    assert store.snapshot(schemas.CONSUME_QUEUE).indexed_columns() == 8
    assert snap.dataset().to_table().num_rows == 3


def test_time_travel_and_missing_tables(store: Store, tmp_path: Path) -> None:
    store.append(schemas.CONSUMER_OFFSET, _offsets(1))
    store.append(schemas.CONSUMER_OFFSET, _offsets(1, start=1))
    assert store.snapshot(schemas.CONSUMER_OFFSET, 1).dataset().to_table().num_rows == 1
    with pytest.raises(TableMissingError):
        open_snapshot(str(tmp_path / "nothing"))
    with pytest.raises(StoreError, match="unknown table"):
        store.snapshot("no_such_table")


def test_the_shared_snapshot_follows_the_table_but_a_private_one_does_not(store: Store) -> None:
    shared = store.shared(schemas.CONSUMER_OFFSET)
    private = store.snapshot(schemas.CONSUMER_OFFSET)
    raw_table(store, schemas.CONSUMER_OFFSET).vacuum(dry_run=True)  # a raw handle changes nothing
    store.append(schemas.CONSUMER_OFFSET, _offsets(1))
    assert store.shared(schemas.CONSUMER_OFFSET) is shared and shared.version() == private.version() + 1
    assert store.app_version(schemas.CONSUMER_OFFSET, "mq.none") == -1


def test_versions_after_yields_each_chunk_with_its_last_version(store: Store) -> None:
    for i in range(5):
        store.append(schemas.CONSUMER_OFFSET, _offsets(1, start=i))
    chunks = list(store.versions_after(schemas.CONSUMER_OFFSET, 1, max_versions=2))
    assert [last for _, last in chunks] == [3, 5]
    assert [rows["_version"].to_pylist() for rows, _ in chunks] == [[2, 3], [4, 5]]
    assert list(store.versions_after(schemas.CONSUMER_OFFSET, 5)) == []


def test_versions_after_finds_other_writers_commits_and_never_skips_cleaned_up_ones(tmp_path: Path) -> None:
    reader = Store.open(tmp_path)
    name = schemas.CONSUMER_OFFSET
    assert reader.shared(name, fresh=False).version() == 0  # the reader's handle stays here
    writer = Store.open(tmp_path)
    for i in range(3):
        writer.append(name, _offsets(1, start=i))
    assert [last for _, last in reader.versions_after(name, 0)] == [3]
    assert list(reader.versions_after(name, 3)) == []
    for i in range(4):
        writer.append(name, _offsets(1, start=10 + i))
    age_and_clean_log(writer, name)  # versions 4..6 are gone, after what the reader covered
    with pytest.raises(StoreError, match="log retention"):
        list(reader.versions_after(name, 3))


def test_every_marker_is_registered_once_and_only_table_state_is_carried() -> None:
    keys = [(m.key, m.kind) for m in MARKERS]
    assert len(keys) == len(set(keys))
    assert all(m.key.startswith("mq.") for m in MARKERS)
    assert carried_markers(schemas.COMMIT_LOG) == (HWM_KEY,)
    assert carried_markers(schemas.CONSUME_QUEUE) == (CQ_KEY,)
    assert carried_markers(schemas.PULL_LOG) == (PULL_LOG_MARKS_KEY,)
    assert carried_markers(schemas.TOPICS) == ()
    assert transaction_app(42).startswith(EXPIRING_APP_PREFIX)
    expiring = delta.app_transactions({transaction_app(1): 3, "mq.job": 4}, EXPIRING_APP_PREFIX, 99)
    assert expiring is not None
    assert [(t.app_id, t.version, t.last_updated) for t in expiring] == [
        ("mq.tx.1", 3, 99),
        ("mq.job", 4, None),
    ]
    assert delta.app_transactions({}) is None


def test_a_shared_snapshot_left_behind_the_log_retention_still_appends(tmp_path: Path) -> None:
    writer = Store.open(tmp_path)
    writer.append(schemas.CONSUMER_OFFSET, _offsets(1))  # the shared snapshot now stands at 1
    other = Store.open(tmp_path)
    for i in range(5):
        other.append(schemas.CONSUMER_OFFSET, _offsets(1, start=10 + i))
    age_and_clean_log(other, schemas.CONSUMER_OFFSET)
    version = writer.append(schemas.CONSUMER_OFFSET, _offsets(1, start=99))
    assert version == 7
    assert sorted(other.read(schemas.CONSUMER_OFFSET)["offset"].to_pylist()) == [0, 10, 11, 12, 13, 14, 99]


def test_a_snapshot_behind_the_log_retention_refreshes_and_its_plans_are_lost_races(tmp_path: Path) -> None:
    store = Store.open(tmp_path)
    stale = store.snapshot(schemas.CONSUMER_OFFSET)
    planned = store.snapshot(schemas.CONSUMER_OFFSET)
    for i in range(3):
        store.append(schemas.CONSUMER_OFFSET, _offsets(1, start=i))
    age_and_clean_log(store, schemas.CONSUMER_OFFSET)
    assert stale.refresh().version() == 3
    with pytest.raises(CommitConflictError) as caught:  # a commit planned on version 0: a lost race
        commit_next(planned, rows=_offsets(1, start=7))
    assert caught.value.retryable
    assert store.version(schemas.CONSUMER_OFFSET) == 3


def test_a_refresh_that_finds_its_successor_commits_gone_reloads_the_table(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    snap = store.snapshot(schemas.CONSUMER_OFFSET)
    store.append(schemas.CONSUMER_OFFSET, _offsets(2))

    def cleaned_up_meanwhile(*args: Any) -> None:  # the files were listed, then cleaned up before being read
        raise FileNotFoundError(
            f"Object at location {store.uri(schemas.CONSUMER_OFFSET)}/_delta_log/1.json not found"
        )

    monkeypatch.setattr(snap._dt, "load_as_version", cleaned_up_meanwhile)  # how a local table moves on
    assert snap.refresh().version() == store.version(schemas.CONSUMER_OFFSET)
    assert snap.moved_since_open == 0  # a new handle, loaded from the table's newest state


def test_a_refresh_that_cannot_read_the_log_for_another_reason_is_a_store_error(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    snap = store.snapshot(schemas.CONSUMER_OFFSET)
    store.append(schemas.CONSUMER_OFFSET, _offsets(1))

    def unreadable(*args: Any) -> None:
        raise PermissionError("permission denied")

    monkeypatch.setattr(snap._dt, "load_as_version", unreadable)
    with pytest.raises(StoreError, match="cannot be refreshed"):
        snap.refresh()


def test_app_versions_asked_together_move_on_from_what_is_known_by_the_new_commits_alone(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    snap = store.snapshot(schemas.CONSUMER_OFFSET)
    commit_next(snap, rows=_offsets(1), transactions=delta.app_transactions({"mq.a": 1}))
    assert snap.app_versions(["mq.a", "mq.b"]) == {"mq.a": 1, "mq.b": -1}  # asked of delta-rs
    asked: list[str] = []
    real = snap._dt.transaction_version

    def counted(app_id: str) -> int | None:
        asked.append(app_id)
        return real(app_id)

    monkeypatch.setattr(snap._dt, "transaction_version", counted)
    commit_next(snap, rows=_offsets(1, 1), transactions=delta.app_transactions({"mq.b": 7}))
    commit_next(snap, rows=_offsets(1, 2), transactions=delta.app_transactions({"mq.a": 3}))
    assert snap.app_versions(["mq.a", "mq.b", "mq.c"]) == {"mq.a": 3, "mq.b": 7, "mq.c": -1}
    assert asked == ["mq.c"]  # the known two moved on by the two new commits, read once for both
    assert [snap.app_version(a) for a in ("mq.a", "mq.b")] == [3, 7]
    older = store.snapshot(schemas.CONSUMER_OFFSET, snap.version() - 1)
    assert older.app_versions(["mq.a", "mq.b"]) == {"mq.a": 1, "mq.b": 7}  # known only as of later


def test_an_app_version_read_whose_log_was_cleaned_up_reads_the_latest_version(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    snap = store.snapshot(schemas.CONSUMER_OFFSET)
    commit_next(
        store.snapshot(schemas.CONSUMER_OFFSET),
        rows=_offsets(1),
        transactions=delta.app_transactions({"mq.t": 4}),
    )

    def cleaned_up(app_id: str) -> int:  # as delta-rs says it when the lazily read log is gone
        raise DeltaError(
            f"Kernel error: File not found: {store.uri(schemas.CONSUMER_OFFSET)}/_delta_log/1.json"
        )

    monkeypatch.setattr(snap._dt, "transaction_version", cleaned_up)
    assert snap.app_version("mq.t") == 4
    assert snap.version() == store.version(schemas.CONSUMER_OFFSET)


def test_a_commit_whose_listed_log_files_were_cleaned_up_reloads_its_handle(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    snap = store.snapshot(schemas.CONSUMER_OFFSET)
    stale = snap._dt
    store.append(schemas.CONSUMER_OFFSET, _offsets(2))
    log = f"{store.uri(schemas.CONSUMER_OFFSET)}/_delta_log"
    gone = f"Object at location {log}/00000000000000000000.json not found"

    def cleaned_up(*args: Any, **kwargs: Any) -> None:
        raise FileNotFoundError(gone)

    monkeypatch.setattr(commits, "write_deltalake", cleaned_up)
    with pytest.raises(CommitConflictError, match="no longer holds") as caught:
        commit_next(snap, rows=_offsets(1))
    assert caught.value.retryable
    # Loaded anew at the latest version: a refresh would have kept the handle that lists the files.
    assert snap._dt is not stale and snap.version() == store.version(schemas.CONSUMER_OFFSET) == 1


def test_commits_checkpoint_at_the_interval_outside_the_commit(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = Path(store.uri(schemas.CONSUMER_OFFSET)) / "_delta_log"
    snap = store.snapshot(schemas.CONSUMER_OFFSET)
    # Every table says Delta's interval; delta-rs's default applies where a table does not.
    assert delta.checkpoint_interval(snap) == int(CHECKPOINT_INTERVAL) == 10
    assert delta.DEFAULT_CHECKPOINT_INTERVAL == 100
    assert commits.expired_log_cleanup(snap)
    for i in range(9):
        commit_next(snap, rows=_offsets(1, start=i))
    assert not list(log.glob("*.checkpoint.parquet"))

    def failing(**kwargs: Any) -> None:
        raise StoreError("checkpoint of consumer_offset failed: disk full")

    monkeypatch.setattr(snap, "checkpoint", failing)
    assert commit_next(snap, rows=_offsets(1, start=9)) == 10  # landed, whatever the checkpoint did
    assert not list(log.glob("*.checkpoint.parquet"))
    monkeypatch.undo()
    for i in range(10):
        commit_next(snap, rows=_offsets(1, start=10 + i))
    assert [p.name for p in log.glob("*.checkpoint.parquet")] == [f"{20:020d}.checkpoint.parquet"]


def test_a_refresh_that_listed_the_log_mid_commit_reads_it_again(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    snap = store.snapshot(schemas.CONSUMER_OFFSET)
    store.append(schemas.CONSUMER_OFFSET, _offsets(2))
    real = snap._dt.load_as_version
    listings = []

    def caught_mid_commit(version: int) -> None:  # the soak saw it: 3961.json, then 3963.json
        listings.append(1)
        if len(listings) < 3:
            raise DeltaError("Generic delta kernel error: Expected contiguous commit files, but found gap")
        real(version)

    monkeypatch.setattr(snap._dt, "load_as_version", caught_mid_commit)
    assert snap.refresh().version() == 1 and len(listings) == 3

    def always_gapped(*args: Any) -> None:
        raise DeltaError("Generic delta kernel error: Expected contiguous commit files, but found gap")

    store.append(schemas.CONSUMER_OFFSET, _offsets(1, start=5))
    monkeypatch.setattr(snap._dt, "load_as_version", always_gapped)
    with pytest.raises(StoreError, match="contiguous"):
        snap.refresh()


def test_opening_a_table_whose_log_was_listed_mid_commit_reads_it_again(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = delta.DeltaTable
    listings: list[int] = []

    def caught_mid_commit(*args: Any, **kwargs: Any) -> Any:
        listings.append(1)
        if len(listings) < 3:
            raise DeltaError("Generic delta kernel error: Expected contiguous commit files, but found gap")
        return real(*args, **kwargs)

    monkeypatch.setattr(delta, "DeltaTable", caught_mid_commit)
    assert store.snapshot(schemas.CONSUMER_OFFSET).version() == 0 and len(listings) == 3

    def always_gapped(*args: Any, **kwargs: Any) -> Any:
        raise DeltaError("Generic delta kernel error: Expected contiguous commit files, but found gap")

    monkeypatch.setattr(delta, "DeltaTable", always_gapped)
    with pytest.raises(StoreError, match="contiguous"):
        store.snapshot(schemas.CONSUMER_OFFSET)


def test_a_local_refresh_loads_exactly_the_newest_commit_file_and_lists_nothing_when_none_is_new(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A listing of _delta_log taken while commits are linked in can miss one and see the next: the
    # newest version is found by looking for the commit files one by one, then loaded as exactly it.
    snap = store.snapshot(schemas.CONSUMER_OFFSET)

    def listed(*args: Any) -> None:
        raise AssertionError("the log was listed for the latest version")

    monkeypatch.setattr(snap._dt, "update_incremental", listed)
    loaded: list[int] = []
    real = snap._dt.load_as_version
    monkeypatch.setattr(snap._dt, "load_as_version", lambda v: (loaded.append(v), real(v)))
    assert snap.refresh().version() == 0 and loaded == []  # nothing new: no delta-rs call at all
    for i in range(3):
        store.append(schemas.CONSUMER_OFFSET, _offsets(1, start=i))
    assert snap.refresh().version() == 3 and loaded == [3]
    assert store.snapshot(schemas.CONSUMER_OFFSET).version() == 3


def test_local_paths_of_absolute_relative_file_and_object_store_uris(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    real = str((tmp_path / "real").resolve())
    assert local_path(str(tmp_path / "link")) == real  # an absolute path, its links resolved
    assert local_path(f"{tmp_path}/real/../link") == real
    monkeypatch.chdir(tmp_path)
    assert local_path("link") == real  # a relative one from the working directory of the moment
    monkeypatch.chdir(tmp_path / "real")
    assert local_path("link") == str(Path(real, "link"))
    assert local_path(f"file://{tmp_path}/real/") == f"{tmp_path}/real"
    assert local_path("s3://bucket/store/commit_log") is None
