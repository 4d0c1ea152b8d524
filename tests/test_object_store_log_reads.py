"""Reading a table's log on an object store costs requests in proportion to what is new, not to the
log's length: app versions move on by the new commits only, a refresh that finds nothing new is one
HEAD, and a commit file is fetched once per process, in one GET. Counted by the proxy (deterministic), never
timed.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pyarrow as pa
import pytest
from deltalake import CommitProperties, Transaction, write_deltalake

from bench.s3proxy import S3Proxy
from engine import Admin, Message, Producer, PullConsumer, Store
from engine.broker.dispatch import dispatch_pending
from engine.errors import StoreError
from engine.store.commit_markers import EXPIRING_APP_PREFIX
from engine.store.delta import (
    VERSION_COLUMN,
    open_snapshot,
    probe_latest_version,
    read_version,
    read_versions,
)
from engine.store.delta import log as log_module

pytestmark = pytest.mark.s3

ROW = pa.table({"a": pa.array([1], pa.int64())})


@pytest.fixture
def options(s3_proxy: S3Proxy, s3_server: Any) -> dict[str, str]:
    return dict(s3_server.storage_options(endpoint=s3_proxy.endpoint))


@pytest.fixture
def uri(s3_root: str) -> str:
    return f"{s3_root}/t-{uuid.uuid4().hex[:6]}"


def append(uri: str, options: dict[str, str], **txns: int) -> None:
    props = CommitProperties(app_transactions=[Transaction(k, v) for k, v in txns.items()]) if txns else None
    write_deltalake(uri, ROW, mode="append", storage_options=options, commit_properties=props)


def counted(proxy: S3Proxy, action: Any) -> tuple[Any, list[str]]:
    proxy.record()
    got = action()
    return got, proxy.record(False)


def test_app_versions_move_on_by_the_new_commits_only(
    uri: str, options: dict[str, str], s3_proxy: S3Proxy
) -> None:
    write_deltalake(uri, ROW, storage_options=options)
    for i in range(20):  # a log 20 commits past its start, no checkpoint
        append(uri, options, **{"app.a": i})
    snap = open_snapshot(uri, options)
    assert snap.app_version("app.a") == 19
    apps = [f"app.{k}" for k in "bcdefghijk"]
    for app in apps:
        snap.app_version(app)  # learnt once (delta-rs replays the log for each)
    append(uri, options, **{"app.a": 20, "app.b": 7})
    snap.refresh()
    answers, seen = counted(s3_proxy, lambda: [snap.app_version(a) for a in ["app.a", *apps]])
    assert answers == [20, 7, *([-1] * 9)]
    # one new commit: read once (one GET) for all eleven ids, not 22 commit files per id
    assert len(seen) <= 1, seen
    assert all("00000000000000000021.json" in r for r in seen), seen


def test_an_app_version_asked_of_an_older_snapshot_is_answered_as_of_it(
    uri: str, options: dict[str, str]
) -> None:
    write_deltalake(uri, ROW, storage_options=options)
    append(uri, options, **{"app.a": 1})
    old = open_snapshot(uri, options)
    append(uri, options, **{"app.a": 2})
    new = open_snapshot(uri, options)
    assert new.app_version("app.a") == 2  # known as of version 2 now
    assert old.app_version("app.a") == 1


def test_expiring_app_ids_are_always_asked_of_delta_rs(
    uri: str, options: dict[str, str], s3_proxy: S3Proxy
) -> None:
    write_deltalake(uri, ROW, storage_options=options)
    app = f"{EXPIRING_APP_PREFIX}guard"
    append(uri, options, **{app: 3})
    snap = open_snapshot(uri, options)
    assert snap.app_version(app) == 3
    _, seen = counted(s3_proxy, lambda: snap.app_version(app))
    assert any(r.endswith("00000000000000000001.json") for r in seen), seen  # replayed, not kept


def test_a_refresh_that_finds_nothing_new_is_one_head(
    uri: str, options: dict[str, str], s3_proxy: S3Proxy
) -> None:
    write_deltalake(uri, ROW, storage_options=options)
    snap = open_snapshot(uri, options)
    _, seen = counted(s3_proxy, snap.refresh)
    assert [r.split(" ")[0] for r in seen] == ["HEAD"], seen
    append(uri, options)
    assert snap.refresh().version() == 1  # and one that does, moves on


def test_a_commit_file_is_fetched_once_per_process(
    uri: str, options: dict[str, str], s3_proxy: S3Proxy
) -> None:
    write_deltalake(uri, ROW, storage_options=options)
    append(uri, options, **{"app.a": 4})
    first, seen = counted(s3_proxy, lambda: read_version(uri, 1, options))
    assert seen and first.transactions == {"app.a": (4, None)}
    again, seen = counted(s3_proxy, lambda: read_version(uri, 1, options))
    assert again == first and seen == []


def test_versions_are_read_with_two_requests_per_file_in_commit_order(
    uri: str, options: dict[str, str], s3_proxy: S3Proxy
) -> None:
    write_deltalake(uri, pa.table({"a": pa.array([0], pa.int64()), "b": ["x"]}), storage_options=options)
    for i in range(1, 7):
        write_deltalake(
            uri,
            pa.table({"a": pa.array([i], pa.int64()), "b": ["y"]}),
            mode="append",
            storage_options=options,
        )
    schema = pa.schema([pa.field("a", pa.int64())])
    rows, seen = counted(s3_proxy, lambda: read_versions(uri, 2, 6, schema, options))
    assert rows.column_names == ["a", VERSION_COLUMN]
    assert rows["a"].to_pylist() == [2, 3, 4, 5, 6]
    assert rows[VERSION_COLUMN].to_pylist() == [2, 3, 4, 5, 6]
    assert rows["a"].num_chunks == 1  # readers' filters and takes cost per chunk
    # each commit file and each data file: one GET (no HEAD, no listing, no ranged footer reads)
    assert len(seen) == 2 * 5 and all(r.startswith("GET ") for r in seen), seen
    assert not any("list-type" in r for r in seen), seen


def test_a_vacuumed_data_file_is_a_typed_error(uri: str, options: dict[str, str], s3_server: Any) -> None:
    write_deltalake(uri, ROW, storage_options=options)
    append(uri, options)
    path = read_version(uri, 1, options).files[0]
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    s3_server.client().delete_object(Bucket=bucket, Key=f"{prefix}/{path}")
    with pytest.raises(StoreError, match="gone"):
        read_versions(uri, 0, 1, ROW.schema, options)


def test_the_latest_version_is_found_by_reading_the_new_commits_once(
    uri: str, options: dict[str, str], s3_proxy: S3Proxy
) -> None:
    write_deltalake(uri, ROW, storage_options=options)
    for _ in range(5):
        append(uri, options)
    latest, seen = counted(s3_proxy, lambda: probe_latest_version(uri, 0, options, remote=True))
    assert latest == 5
    assert not any("list-type" in r for r in seen), seen  # no listing of the log
    assert sum(r.endswith("00000000000000000006.json") for r in seen) == 1  # one look past the end
    _, again = counted(s3_proxy, lambda: [read_version(uri, v, options) for v in range(1, 6)])
    assert again == []  # the commits it found are read already
    assert probe_latest_version(uri, 0, options) is None  # without ``remote``: list the log then


def test_dispatch_moves_its_consume_queue_snapshot_on_rather_than_opening_one(
    s3_proxy: S3Proxy, s3_server: Any, s3_root: str
) -> None:
    store = Store.open(s3_root, storage_options=dict(s3_server.storage_options(endpoint=s3_proxy.endpoint)))
    Admin(store).create_topic("T", 1)
    with Producer(store, "P") as producer:
        for _ in range(4):
            producer.send(Message("T", b"x"), queue_id=0)
            assert dispatch_pending(store) == 1
        producer.send(Message("T", b"y"), queue_id=0)
        added, seen = counted(s3_proxy, lambda: dispatch_pending(store))
    assert added == 1
    cq = [r for r in seen if "consume_queue" in r and r.startswith("GET ")]
    # no load of the consume queue from its start: no checkpoint hint, none of its older commits
    assert not any("_last_checkpoint" in r for r in cq), cq
    old = [f"/consume_queue/_delta_log/{v:020d}.json" for v in range(4)]
    assert not any(r.endswith(o) for r in cq for o in old), cq
    assert PullConsumer(store, "G").pull("T", 0, 4).messages[0].body == b"y"


def test_the_deltalog_stream_finds_new_versions_by_heads_of_the_next_commit_files(
    uri: str, options: dict[str, str], s3_proxy: S3Proxy
) -> None:
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from engine.spark.deltalog import DeltaLogStreamReader, LogOptions, spark_schema, table_schema

    write_deltalake(uri, ROW, storage_options=options)
    opts = LogOptions.parse({"path": uri, "storageOptions": json.dumps(options)})
    reader = DeltaLogStreamReader(opts, spark_schema(table_schema(opts)), table_schema(opts))
    start = reader.initialOffset()
    assert reader.latestOffset(start, ReadAllAvailable()) == {"version": 0}
    offset, seen = counted(s3_proxy, lambda: reader.latestOffset(start, ReadAllAvailable()))
    assert offset == {"version": 0} and [r.split(" ")[0] for r in seen] == ["HEAD"], seen
    append(uri, options)
    append(uri, options)
    offset, seen = counted(s3_proxy, lambda: reader.latestOffset(start, ReadAllAvailable()))
    assert offset == {"version": 2}
    assert [r.split(" ")[0] for r in seen] == ["HEAD"] * 3, seen  # versions 1, 2 and the missing 3


def pulled_once_then_sent(
    proxy: S3Proxy, server: Any, root: str, bodies: list[bytes]
) -> tuple[Store, PullConsumer]:
    """A store through the proxy whose queue T:0 a consumer pulled once (offset 0), then ``bodies``
    sent and dispatched after it (offsets 1, 2, ...)."""
    store = Store.open(root, storage_options=dict(server.storage_options(endpoint=proxy.endpoint)))
    Admin(store).create_topic("T", 1)
    consumer = PullConsumer(store, "G")
    with Producer(store, "P") as producer:
        producer.send(Message("T", b"a"), queue_id=0)
        dispatch_pending(store)
        assert len(consumer.pull("T", 0, 0).messages) == 1
        for body in bodies:
            producer.send(Message("T", body), queue_id=0)
        dispatch_pending(store)
    return store, consumer


def test_a_pull_that_finds_a_new_consume_queue_version_looks_for_it_once(
    s3_proxy: S3Proxy, s3_server: Any, s3_root: str
) -> None:
    store, consumer = pulled_once_then_sent(s3_proxy, s3_server, s3_root, [b"b"])
    version = store.version("consume_queue")
    result, seen = counted(s3_proxy, lambda: consumer.pull("T", 0, 1))
    assert [m.body for m in result.messages] == [b"b"]
    new_commit = f"/consume_queue/_delta_log/{version:020d}.json"
    looks = [r for r in seen if r.endswith(new_commit)]
    # the engine looks once, with a GET that keeps the commit file (delta-rs's refresh then reads it
    # itself); no HEAD before it
    assert seen[0] == looks[0] and looks[0].startswith("GET "), "\n".join(seen)
    assert not any(r.startswith("HEAD ") for r in looks), "\n".join(seen)


def test_a_pull_of_new_messages_moves_its_commit_log_files_on_from_the_new_commits(
    s3_proxy: S3Proxy, s3_server: Any, s3_root: str
) -> None:
    _, consumer = pulled_once_then_sent(s3_proxy, s3_server, s3_root, [b"b", b"c", b"d"])
    result, seen = counted(s3_proxy, lambda: consumer.pull("T", 0, 1))
    assert [m.body for m in result.messages] == [b"b", b"c", b"d"]
    assert [m.queue_offset for m in result.messages] == [1, 2, 3]
    log = [r for r in seen if "commit_log" in r and ("_delta_log" in r or "list-type" in r)]
    assert not any("list-type" in r or "_last_checkpoint" in r for r in log), log
    assert len(log) <= 3 + 1, log  # each new commit file once (one GET), one look past them


@pytest.mark.parametrize("small", [True, False], ids=["small-file", "large-file"])
def test_a_version_reads_alike_as_a_small_or_a_large_file_and_an_older_schema_is_filled_in(
    uri: str, options: dict[str, str], tmp_path: Any, monkeypatch: pytest.MonkeyPatch, small: bool
) -> None:
    if not small:  # every file read as a large one: pyarrow's threads and read-ahead
        monkeypatch.setattr(log_module, "SMALL_FILE_BYTES", 0)
    older = pa.schema([("a", pa.int64())])
    newer = older.append(pa.field("b", pa.string()))  # a column added since the file was written
    for where, opts in ((str(tmp_path / "t"), None), (uri, options)):
        write_deltalake(where, pa.table({"a": [1, 2]}, schema=older), storage_options=opts)
        rows = read_versions(where, 0, 0, older, opts)
        assert rows.column("a").to_pylist() == [1, 2] and rows.column("_version").to_pylist() == [0, 0]
        filled = read_versions(where, 0, 0, newer, opts)
        assert filled.column("a").to_pylist() == [1, 2] and filled.column("b").to_pylist() == [None, None]
