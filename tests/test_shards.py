"""Commit-log shards: the pure rules (which shard holds a queue, which shard an offset names) and a
store's shard tables, fixed when it is created."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine import Admin, Message, Producer, Store
from engine.config import load_config
from engine.errors import ConfigError, InvalidArgumentError, StoreError
from engine.protocol.message_ids import make_msg_id, parse_msg_id
from engine.protocol.shards import MAX_SHARDS, SHARD_SHIFT, shard_base, shard_of_offset, shard_of_queue
from engine.protocol.tags import java_string_hashcode
from engine.store import schemas
from engine.store.commit_log import CommitLogWriter
from engine.store.commit_log.hwm import read_hwm, recover_hwm_by_scan
from engine.store.commit_log.stamping import PendingMessage


def test_one_shard_holds_every_queue() -> None:
    assert {shard_of_queue(t, q, 1) for t in ("A", "B", "%RETRY%g") for q in range(16)} == {0}


def test_a_topics_queues_go_round_robin_from_a_start_its_name_picks() -> None:
    start = (java_string_hashcode("Orders") & 0x7FFFFFFF) % 4
    assert [shard_of_queue("Orders", q, 4) for q in range(8)] == [(start + q) % 4 for q in range(8)]
    assert sorted(shard_of_queue("Orders", q, 4) for q in range(4)) == [0, 1, 2, 3]


def test_topics_with_one_queue_do_not_all_land_on_shard_zero() -> None:
    shards = {shard_of_queue(f"T{i}", 0, 4) for i in range(40)}
    assert shards == {0, 1, 2, 3}


@pytest.mark.parametrize("shards", [0, MAX_SHARDS + 1, -1, True, 2.0])
def test_a_shard_count_outside_1_to_128_is_refused(shards: object) -> None:
    with pytest.raises(InvalidArgumentError):
        shard_of_queue("T", 0, shards)  # type: ignore[arg-type]


def test_a_negative_queue_is_refused() -> None:
    with pytest.raises(InvalidArgumentError):
        shard_of_queue("T", -1, 4)


def test_an_offset_names_its_shard_and_so_does_its_message_id() -> None:
    offset = shard_base(5) + 12_345
    assert shard_of_offset(offset) == 5
    assert shard_of_offset(12_345) == 0
    assert shard_of_offset(shard_base(MAX_SHARDS - 1) + (1 << SHARD_SHIFT) - 1) == MAX_SHARDS - 1
    assert shard_of_offset(parse_msg_id(make_msg_id("00" * 8, offset))[1]) == 5
    assert shard_base(MAX_SHARDS - 1) + (1 << SHARD_SHIFT) - 1 == 2**63 - 1  # still a positive int64


@pytest.mark.parametrize("bad", [-1, MAX_SHARDS, True])
def test_a_shard_outside_0_to_127_has_no_base(bad: object) -> None:
    with pytest.raises(InvalidArgumentError):
        shard_base(bad)  # type: ignore[arg-type]


def test_a_negative_offset_has_no_shard() -> None:
    with pytest.raises(InvalidArgumentError):
        shard_of_offset(-1)


def test_commit_log_table_names_round_trip() -> None:
    assert schemas.commit_log_table(0) == "commit_log"
    assert [schemas.shard_of_table(schemas.commit_log_table(k)) for k in range(4)] == [0, 1, 2, 3]
    for name in ("consume_queue", "commit_log_", "commit_log_01", "commit_log_x", "commit_logs"):
        assert schemas.shard_of_table(name) is None
    assert schemas.schema_of("commit_log_7") is schemas.COMMIT_LOG_SCHEMA
    with pytest.raises(KeyError):
        schemas.schema_of("commit_log_07")


def test_a_store_without_the_setting_has_one_shard_and_no_extra_commit(tmp_path: Path) -> None:
    store = Store.open(tmp_path)
    assert store.commit_log_shards == 1
    assert store.commit_logs == ("commit_log",)
    assert store.version("commit_log") == 0
    assert not (tmp_path / "commit_log_1").exists()


def test_a_sharded_store_creates_a_commit_log_per_shard_starting_at_its_base(tmp_path: Path) -> None:
    store = Store.open(tmp_path, config=load_config(commit_log_shards=3))
    assert store.commit_logs == ("commit_log", "commit_log_1", "commit_log_2")
    assert store.tables()[-2:] == ("commit_log_1", "commit_log_2")
    for shard, name in enumerate(store.commit_logs):
        assert read_hwm(store.snapshot(name)).physical == shard_base(shard)


def test_the_shard_count_is_the_stores_whatever_a_later_config_says(tmp_path: Path) -> None:
    Store.open(tmp_path, config=load_config(commit_log_shards=3))
    assert Store.open(tmp_path).commit_log_shards == 3  # the default config (1) reads the store's count
    with pytest.raises(ConfigError, match="only be set when a store is created"):
        Store.open(tmp_path, config=load_config(commit_log_shards=2))


def test_an_existing_store_cannot_gain_shards(tmp_path: Path) -> None:
    store = Store.open(tmp_path)
    Admin(store).create_topic("T", 1)
    with Producer(store) as producer:
        producer.send(Message("T", b"x"))  # the commit log has history
    with pytest.raises(ConfigError, match="has 1 commit-log shard"):
        Store.open(tmp_path, config=load_config(commit_log_shards=4))


def test_a_shard_the_store_does_not_have_is_an_unknown_table(tmp_path: Path) -> None:
    store = Store.open(tmp_path, config=load_config(commit_log_shards=2))
    store.snapshot("commit_log_1")
    with pytest.raises(StoreError, match="unknown table"):
        store.snapshot("commit_log_2")


@pytest.mark.parametrize("bad", [0, MAX_SHARDS + 1, "4x"])
def test_the_config_refuses_a_bad_shard_count(bad: object) -> None:
    with pytest.raises(ConfigError):
        load_config(commit_log_shards=bad)


def test_a_shards_writer_stamps_offsets_from_its_base_in_its_own_table(tmp_path: Path) -> None:
    store = Store.open(tmp_path, config=load_config(commit_log_shards=2))
    topic = next(f"T{i}" for i in range(100) if shard_of_queue(f"T{i}", 0, 2) == 1)
    stamped = CommitLogWriter(store, shard=1).append(
        [PendingMessage(topic, 0, b"a", "U-A"), PendingMessage(topic, 0, b"bb", "U-B")]
    )
    first, second = (s.physical_offset for s in stamped)
    assert first == shard_base(1) < second  # offsets advance by the record's size, as RocketMQ's
    assert [shard_of_offset(s.physical_offset) for s in stamped] == [1, 1]
    assert [s.queue_offset for s in stamped] == [0, 1]
    assert store.version("commit_log_1") == 1 and store.version("commit_log") == 1  # shard 0: the count only
    assert store.read("commit_log_1").num_rows == 2 and store.read("commit_log").num_rows == 0


@pytest.mark.parametrize("shard", [-1, 2, True])
def test_a_writer_for_a_shard_the_store_lacks_is_refused(tmp_path: Path, shard: object) -> None:
    store = Store.open(tmp_path, config=load_config(commit_log_shards=2))
    with pytest.raises(InvalidArgumentError, match="not a commit-log shard"):
        CommitLogWriter(store, shard=shard)  # type: ignore[arg-type]


def test_an_empty_shards_marks_recovered_by_scan_start_at_its_base(tmp_path: Path) -> None:
    store = Store.open(tmp_path, config=load_config(commit_log_shards=3))
    assert recover_hwm_by_scan(store.snapshot("commit_log_2")).physical == shard_base(2)
    assert recover_hwm_by_scan(store.snapshot("commit_log")).physical == 0
