"""Store.open and Admin: tables, topics, stats."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from engine import (
    Admin,
    InvalidArgumentError,
    InvalidTopicError,
    Message,
    Producer,
    Store,
    StoreError,
    TopicExistsError,
    TopicNotFoundError,
)
from engine.broker.dispatch import dispatch_pending
from engine.store import schemas
from tests.helpers import versions


def test_open_creates_every_table_with_its_schema(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "s")
    for name, schema in schemas.SCHEMAS.items():
        dt = DeltaTable(str(tmp_path / "s" / name))
        assert pa.schema(dt.schema().to_arrow()).names == schema.names
        assert dt.protocol().min_reader_version == 1  # readable by any Delta reader
    assert len(store.store_id) == 16


def test_reopen_is_idempotent_and_keeps_store_id(tmp_path: Path) -> None:
    a = Store.open(tmp_path / "s")
    before = versions(a)
    b = Store.open(tmp_path / "s")
    assert versions(b) == before and a.store_id == b.store_id


def _open(root: str) -> None:
    Store.open(root)


def test_concurrent_first_open_is_safe(tmp_path: Path) -> None:
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_open, args=(str(tmp_path / "s"),)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert all(v == 0 for v in versions(Store.open(tmp_path / "s")).values())


def test_open_rejects_a_table_with_another_schema(tmp_path: Path) -> None:
    write_deltalake(str(tmp_path / "s" / "commit_log"), pa.table({"x": [1]}))
    with pytest.raises(StoreError, match="not a commit_log table"):
        Store.open(tmp_path / "s")


def test_open_rejects_an_empty_path() -> None:
    with pytest.raises(StoreError):
        Store.open("")


def test_create_topic_and_list(admin: Admin) -> None:
    cfg = admin.create_topic("Orders", 8)
    assert (cfg.name, cfg.queues, cfg.perm) == ("Orders", 8, 6)
    admin.create_topic("Audit")
    assert [(t.name, t.queues) for t in admin.topics()] == [("Audit", 4), ("Orders", 8)]


def test_create_topic_is_idempotent_for_same_settings(store: Store, admin: Admin) -> None:
    admin.create_topic("A", 2)
    v = store.version("topics")
    admin.create_topic("A", 2)
    assert store.version("topics") == v
    with pytest.raises(TopicExistsError):
        admin.create_topic("A", 3)


@pytest.mark.parametrize(
    ("name", "queues", "error"),
    [
        ("bad name", 4, InvalidTopicError),
        ("x" * 128, 4, InvalidTopicError),
        ("SCHEDULE_TOPIC_XXXX", 4, InvalidTopicError),
        ("%RETRY%g", 1, InvalidTopicError),
        ("%DLQ%g", 1, InvalidTopicError),
        ("rmq_sys_x", 1, InvalidTopicError),
        ("Ok", 0, InvalidArgumentError),
        ("Ok", 1025, InvalidArgumentError),
        ("Ok", "4", InvalidArgumentError),
    ],
)
def test_create_topic_bad_input_writes_nothing(
    store: Store, admin: Admin, name: str, queues: object, error: type[Exception]
) -> None:
    before = versions(store)
    with pytest.raises(error):
        admin.create_topic(name, queues)  # type: ignore[arg-type]
    assert versions(store) == before


def test_topic_stats_report_the_pullable_bounds_and_last_store_time(
    store: Store, admin: Admin, topic: str
) -> None:
    with Producer(store) as p:
        results = [p.send(Message(topic, b"x"), queue_id=1) for _ in range(3)]
    stats = admin.topic_stats(topic)  # pullable at once: the consume queue's tail
    assert [(s.queue_id, s.min_offset, s.max_offset) for s in stats] == [
        (0, 0, 0),
        (1, 0, 3),
        (2, 0, 0),
        (3, 0, 0),
    ]
    dispatch_pending(store)
    stats = admin.topic_stats(topic)
    assert (stats[1].min_offset, stats[1].max_offset) == (0, 3)
    assert stats[1].last_store_ts_ms is not None and stats[1].last_store_ts_ms >= results[-1].queue_offset
    assert stats[0].max_offset == 0 and stats[0].last_store_ts_ms is None


def test_topic_stats_of_unknown_topic_raises(admin: Admin) -> None:
    with pytest.raises(TopicNotFoundError):
        admin.topic_stats("Nope")


def test_schedule_topic_has_a_queue_per_delay_level_plus_timers(admin: Admin) -> None:
    assert admin.ensure_schedule_topic().queues == 19
    assert "SCHEDULE_TOPIC_XXXX" not in [t.name for t in admin.topics()]
    assert "SCHEDULE_TOPIC_XXXX" in [t.name for t in admin.topics(include_system=True)]


def test_store_time_never_goes_backwards_in_commit_order(store: Store, topic: str) -> None:
    with Producer(store) as p:
        for _ in range(20):
            p.send(Message(topic, b"x"))
    rows = sorted(store.read(schemas.COMMIT_LOG).to_pylist(), key=lambda r: r["physical_offset"])
    ts = [r["store_ts_ms"] for r in rows]
    assert ts == sorted(ts)


@pytest.mark.parametrize("direct", ["1", "0"], ids=["direct", "delta-rs"])
def test_the_shared_handle_is_reopened_past_each_checkpoint_and_keeps_every_row(
    store: Store, direct: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from engine.store.delta import RENEW_HANDLE_COMMITS

    monkeypatch.setenv("MQ_DIRECT_APPEND", direct)
    first = store.shared(schemas.CONSUMER_OFFSET, fresh=False)
    handles = [first]  # kept alive: the id of a freed handle may be given to a new one
    renewed_at = []
    schema = schemas.SCHEMAS[schemas.CONSUMER_OFFSET]
    for i in range(RENEW_HANDLE_COMMITS + 3):
        row = {"group": "g", "topic": "T", "queue_id": 0, "offset": i, "ts_ms": i, "consumer_id": ""}
        store.append(schemas.CONSUMER_OFFSET, pa.Table.from_pylist([row], schema=schema))
        handle = store.shared(schemas.CONSUMER_OFFSET)  # a direct append leaves it to readers to move it
        if all(handle is not seen for seen in handles):
            handles.append(handle)
            renewed_at.append(handle.version())
    # Checkpointed every 10 versions (Delta's interval): reopened from each checkpoint, 3 in 35 commits.
    assert renewed_at == [10, 20, 30]
    log = Path(store.uri(schemas.CONSUMER_OFFSET)) / "_delta_log"
    assert sorted(p.name for p in log.glob("*.checkpoint.parquet")) == [
        f"{v:020d}.checkpoint.parquet" for v in (10, 20, 30)
    ]
    renewed = store.shared(schemas.CONSUMER_OFFSET, fresh=False)
    assert renewed is not first and renewed.version() == store.version(schemas.CONSUMER_OFFSET)
    offsets = sorted(store.read(schemas.CONSUMER_OFFSET)["offset"].to_pylist())
    assert offsets == list(range(RENEW_HANDLE_COMMITS + 3))


def test_a_handle_ages_by_versions_or_past_a_checkpoint(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    import engine.store.delta.snapshot as delta

    snap = store.snapshot(schemas.CONSUMER_OFFSET)
    schema = schemas.SCHEMAS[schemas.CONSUMER_OFFSET]
    row = {"group": "g", "topic": "T", "queue_id": 0, "offset": 0, "ts_ms": 0, "consumer_id": ""}
    for _ in range(9):
        store.append(schemas.CONSUMER_OFFSET, pa.Table.from_pylist([row], schema=schema))
    assert not snap.refresh().aged  # at version 9: no checkpoint passed
    store.append(schemas.CONSUMER_OFFSET, pa.Table.from_pylist([row], schema=schema))
    assert snap.refresh().aged  # at 10: moved by the interval and onto a checkpoint version
    late = store.snapshot(schemas.CONSUMER_OFFSET)  # opened at 10
    for _ in range(9):
        store.append(schemas.CONSUMER_OFFSET, pa.Table.from_pylist([row], schema=schema))
    assert not late.refresh().aged  # moved by 9 < 10
    monkeypatch.setattr(delta, "RENEW_HANDLE_COMMITS", 5)
    assert late.aged  # moved by 9 >= 5


def test_the_groups_log_reopens_its_handle_and_keeps_its_leases(store: Store) -> None:
    from engine.store.delta import RENEW_HANDLE_COMMITS
    from engine.store.groups import GroupLog

    log = GroupLog(store)
    granted = log.write(group="g", owner="c1", lock=[("T", 0)])
    opened = {id(log._dt)}
    for _ in range(RENEW_HANDLE_COMMITS + 1):
        log.write(group="g", owner="c1", lock=[("T", 0)])
        opened.add(id(log._dt))
    assert granted == {("T", 0)}
    assert len(opened) >= 2  # None in between, then a fresh handle
    assert log.write(group="g", owner="c2", lock=[("T", 0)]) == set()  # c1's lease held throughout
    assert GroupLog(store).leases("g")[("T", 0)].owner == "c1"
