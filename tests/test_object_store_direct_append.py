"""Commit-log appends committed by the engine itself on S3 (engine.store.delta.direct_append's
:class:`S3LogObjects`), on the real S3 server: a version is taken by one conditional PUT
(``If-None-Match: *``) or not at all, a commit whose answer was lost is read back and counted as
landed, a 412 is a lost race, and every Delta reader reads what was committed.
"""

from __future__ import annotations

import itertools
import threading
import uuid
from datetime import timedelta
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from bench.s3proxy import S3Proxy
from engine import Admin, CommitConflictError, Message, Producer, Store
from engine.errors import CommitStateUnknownError, StoreAccessDeniedError, StoreError
from engine.store import schemas
from engine.store.commit_log import CommitLogWriter
from engine.store.commit_log import writer as writer_module
from engine.store.commit_log.stamping import PendingMessage
from engine.store.commit_markers import BATCH_KEY
from engine.store.delta.direct_append import DirectAppender, S3LogObjects, direct_appender
from engine.store.delta.objects import delete_object, put_new_object, s3_client, s3_config, s3_retries

pytestmark = pytest.mark.s3


# ----------------------------------------------------------------------------- options (no server)
def test_delta_rs_storage_options_map_to_obstores_s3_and_client_settings() -> None:
    config, client = s3_config(
        {
            "AWS_ENDPOINT_URL": "http://127.0.0.1:1",
            "aws_access_key_id": "k",
            "AWS_SECRET_ACCESS_KEY": "s",
            "AWS_REGION": "r",
            "AWS_ALLOW_HTTP": "true",
            "timeout": "1s",
            "AWS_S3_LOCKING_PROVIDER": "dynamodb",  # delta-rs's own: object_store does not know it
        }
    )
    assert config == {
        "endpoint": "http://127.0.0.1:1",
        "access_key_id": "k",
        "secret_access_key": "s",
        "region": "r",
        "conditional_put": "etag",  # commits are put with If-None-Match: *
    }
    assert client == {"allow_http": "true", "timeout": "1s"}
    assert s3_config({"conditional_put": "disabled"})[0]["conditional_put"] == "disabled"
    assert s3_retries({"max_retries": "2", "retry_timeout": "1500ms"}) == {
        "max_retries": 2,
        "retry_timeout": timedelta(seconds=1.5),
    }
    assert s3_retries({"AWS_REGION": "r"}) == {}
    with pytest.raises(StoreError):
        s3_retries({"retry_timeout": "soon"})


def test_only_s3_roots_get_an_obstore_client() -> None:
    options = {"AWS_REGION": "r", "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"}
    client = s3_client("s3a://bucket/store/commit_log/", options)
    assert client is not None and client[1] == "store/commit_log/"
    assert client[0] is s3_client("s3://bucket/other", options)[0]  # type: ignore[index]  # one per bucket
    assert s3_client("s3://bucket", options)[1] == ""  # type: ignore[index]
    assert s3_client("gs://bucket/store", options) is None
    assert s3_client("/tmp/store", options) is None


# ----------------------------------------------------------------------------- on the server
@pytest.fixture
def store(s3_proxy: S3Proxy, s3_server: Any, s3_root: str) -> Store:
    """A store on the S3 server through the proxy, whose topic (:func:`topic`) holds one message."""
    return Store.open(s3_root, storage_options=s3_server.storage_options(endpoint=s3_proxy.endpoint))


@pytest.fixture
def topic(store: Store) -> str:
    name = f"T{uuid.uuid4().hex[:6]}"
    Admin(store).create_topic(name, 1)
    with Producer(store, "P") as producer:
        producer.send(Message(name, b"first"), queue_id=0)
    return name


def appender(store: Store) -> DirectAppender:
    found = direct_appender(store.snapshot(schemas.COMMIT_LOG), schemas.COMMIT_LOG_SCHEMA, on_s3=True)
    assert found is not None and isinstance(found.objects, S3LogObjects)
    return found


def one_row(store: Store) -> pa.Table:
    return store.read(schemas.COMMIT_LOG).select(schemas.COMMIT_LOG_SCHEMA.names).slice(0, 1)


def batch_at(direct: DirectAppender, version: int) -> str | None:
    commit = direct.read_commit(version)
    return None if commit is None else commit.batch_id


def test_a_commit_log_writer_on_s3_appends_directly_in_two_puts(
    store: Store, topic: str, s3_proxy: S3Proxy
) -> None:
    writer = CommitLogWriter(store)
    writer.append([PendingMessage(topic=topic, queue_id=0, body=b"warm", uniq_key="w")])
    assert writer.direct
    s3_proxy.record()
    writer.append([PendingMessage(topic=topic, queue_id=0, body=b"b", uniq_key="b")])
    seen = s3_proxy.record(False)
    assert [r.split(" ")[0] for r in seen] == ["PUT", "PUT"], seen
    assert seen[0].endswith(".parquet") and seen[1].endswith(f"{store.version(schemas.COMMIT_LOG):020d}.json")


def test_two_writers_racing_for_one_version_one_wins_the_other_conflicts(store: Store, topic: str) -> None:
    first, second = appender(store), appender(store)
    version = store.version(schemas.COMMIT_LOG) + 1
    rows = one_row(store)
    adds = [first.write_file(rows), second.write_file(rows)]
    ready = threading.Barrier(2)
    outcomes: dict[str, BaseException | None] = {}

    def commit(name: str, direct: DirectAppender, add: dict[str, Any]) -> None:
        ready.wait()
        try:
            direct.commit(version, add, {BATCH_KEY: name})
            outcomes[name] = None
        except BaseException as exc:
            outcomes[name] = exc

    threads = [
        threading.Thread(target=commit, args=a) for a in (("a", first, adds[0]), ("b", second, adds[1]))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [name for name, exc in outcomes.items() if exc is None]
    losers = [exc for exc in outcomes.values() if exc is not None]
    assert len(winners) == 1 and len(losers) == 1, outcomes
    assert isinstance(losers[0], CommitConflictError)
    assert batch_at(first, version) == winners[0]
    assert not first.exists(version + 1)  # the loser committed nowhere else


def test_a_commit_that_landed_but_answered_503_is_landed(store: Store, topic: str, s3_proxy: S3Proxy) -> None:
    direct = appender(store)
    version = store.version(schemas.COMMIT_LOG) + 1
    add = direct.write_file(one_row(store))
    rule = s3_proxy.fail(rf"/commit_log/_delta_log/0*{version}\.json", method="PUT", status=503, after=True)
    direct.commit(version, add, {BATCH_KEY: "mine"})  # the retry met 412: read back, it is ours
    assert rule.hits, "the fault did not hit the commit PUT"
    assert batch_at(direct, version) == "mine"
    assert not direct.exists(version + 1)


def test_a_412_on_a_version_another_writer_holds_is_a_lost_race(store: Store, topic: str) -> None:
    rival, direct = appender(store), appender(store)
    version = store.version(schemas.COMMIT_LOG) + 1
    rows = one_row(store)
    rival.commit(version, rival.write_file(rows), {BATCH_KEY: "rival"})
    with pytest.raises(CommitConflictError) as lost:
        direct.commit(version, direct.write_file(rows), {BATCH_KEY: "mine"})
    assert lost.value.context.get("read_back")  # the writer need not read it again
    assert batch_at(direct, version) == "rival"


def test_a_commit_put_that_cannot_be_resolved_is_unknown_not_failed(
    store: Store, topic: str, s3_proxy: S3Proxy, s3_server: Any
) -> None:
    direct = appender(store)
    version = store.version(schemas.COMMIT_LOG) + 1
    add = direct.write_file(one_row(store))
    # every answer about the commit is lost: the put, its retries and the read back
    rule = s3_proxy.fail(rf"/commit_log/_delta_log/0*{version}\.json", status=503, times=-1)
    options = {
        **s3_server.storage_options(endpoint=s3_proxy.endpoint),
        "max_retries": "1",
        "retry_timeout": "5s",
    }
    quick = DirectAppender(S3LogObjects(direct.uri, options), direct.name, direct.schema, direct.indexed)
    try:
        with pytest.raises(CommitStateUnknownError):
            quick.commit(version, add, {BATCH_KEY: "mine"})
    finally:
        s3_proxy.clear()
    assert rule.hits
    assert not direct.exists(version)  # (a 503 before forwarding: nothing landed here)


def test_a_refused_commit_is_a_typed_failure_and_writes_nothing(
    store: Store, topic: str, s3_server: Any
) -> None:
    direct = appender(store)
    version = store.version(schemas.COMMIT_LOG) + 1
    add = direct.write_file(one_row(store))
    secret = "not-the-secret-" + uuid.uuid4().hex
    wrong = {**s3_server.storage_options(), "AWS_SECRET_ACCESS_KEY": secret}
    refused = DirectAppender(S3LogObjects(direct.uri, wrong), direct.name, direct.schema, direct.indexed)
    with pytest.raises(StoreAccessDeniedError) as denied:
        refused.commit(version, add, {BATCH_KEY: "mine"})
    assert secret not in str(denied.value)
    assert not direct.exists(version)


def test_a_conditional_put_refuses_an_object_that_exists(s3_root: str, s3_options: dict[str, str]) -> None:
    assert put_new_object(s3_root, "x/one.json", b"1", s3_options)
    assert not put_new_object(s3_root, "x/one.json", b"2", s3_options)
    with pytest.raises(StoreError):
        put_new_object("/tmp/not-s3", "x/one.json", b"1")


def test_delta_rs_reads_what_racing_writers_committed_directly_with_dense_offsets(
    store: Store, topic: str, s3_options: dict[str, str]
) -> None:
    writers = [CommitLogWriter(store) for _ in range(3)]

    def send(i: int, writer: CommitLogWriter) -> None:
        for j in range(4):
            writer.append(
                [PendingMessage(topic=topic, queue_id=0, body=f"{i}-{j}".encode(), uniq_key=f"{i}{j}")]
            )

    threads = [threading.Thread(target=send, args=(i, w)) for i, w in enumerate(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(w.direct for w in writers)
    rows = (
        DeltaTable(store.uri(schemas.COMMIT_LOG), storage_options=s3_options).to_pyarrow_table().to_pylist()
    )
    mine = sorted(r["queue_offset"] for r in rows if r["topic"] == topic)
    assert mine == list(range(13))  # the fixture's first message, then 12: dense, none twice
    physical = sorted((r["physical_offset"], r["size"]) for r in rows)
    assert all(a + size == b for (a, size), (b, _) in itertools.pairwise(physical))


def test_a_writer_that_has_not_looked_for_long_looks_before_committing_past_a_cleaned_up_log(
    store: Store, topic: str, s3_options: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def message(body: bytes) -> list[PendingMessage]:
        return [PendingMessage(topic=topic, queue_id=0, body=body, uniq_key=body.hex())]

    idle = CommitLogWriter(store)
    idle.append(message(b"before"))
    known = store.version(schemas.COMMIT_LOG)
    rival = CommitLogWriter(store)
    for i in range(3):
        rival.append(message(f"rival {i}".encode()))
    latest = store.version(schemas.COMMIT_LOG)
    # a checkpoint, then the log cleanup of the commit after the idle writer's version
    store.snapshot(schemas.COMMIT_LOG).checkpoint(cleanup=False)
    delete_object(store.uri(schemas.COMMIT_LOG), f"_delta_log/{known + 1:020d}.json", s3_options)
    monkeypatch.setattr(writer_module, "STALE_LOOK_S", 0.0)  # its look is old now
    stamped = idle.append_batch(message(b"after"))
    assert stamped.version == latest + 1  # not on the cleaned-up version known + 1
    assert not idle.append([]) and store.version(schemas.COMMIT_LOG) == latest + 1
