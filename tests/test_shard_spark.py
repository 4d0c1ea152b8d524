"""Spark over a store with several commit-log shards: the ``commit_log`` and ``messages`` views, replay
(native scan and the ``mq`` source), the catalog tables and time travel see every shard."""

from __future__ import annotations

from typing import Any

import pytest
from chispa import assert_df_equality

from engine import Admin, InvalidArgumentError, Store
from engine.broker.dispatch import dispatch_pending
from engine.config import load_config
from engine.protocol.shards import shard_of_queue
from engine.spark import register_views, replay
from engine.spark.delta_reads import history, register_tables, table_as_of
from engine.store import schemas
from tests.helpers import append_to_queues
from tests.test_native_delta import require_delta

pytestmark = pytest.mark.spark

SHARDS = 3
TOPIC = "Orders"
OTHER = "Other"


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> Store:
    """One 3-shard store for the module: ``Orders`` with a queue on each shard (3 messages each),
    ``Other`` with one queue and 2 messages; dispatched, plus one undispatched ``Orders`` message."""
    store = Store.open(tmp_path_factory.mktemp("sharded"), config=load_config(commit_log_shards=SHARDS))
    Admin(store).create_topic(TOPIC, SHARDS)
    Admin(store).create_topic(OTHER, 1)
    assert sorted(shard_of_queue(TOPIC, q, SHARDS) for q in range(SHARDS)) == [0, 1, 2]
    append_to_queues(store, TOPIC, {q: [f"q{q}-m{i}".encode() for i in range(3)] for q in range(SHARDS)})
    append_to_queues(store, OTHER, {0: [b"o0", b"o1"]})
    dispatch_pending(store)
    late = next(q for q in range(SHARDS) if shard_of_queue(TOPIC, q, SHARDS) == 2)
    append_to_queues(store, TOPIC, {late: [b"undispatched"]})
    return store


def _expected(spark: Any, rows: list[tuple[str, int, int, bytes]]) -> Any:
    return spark.createDataFrame(rows, "topic string, queue_id int, queue_offset long, body binary")


def _dispatched(topic: str | None = None) -> list[tuple[str, int, int, bytes]]:
    rows = [(TOPIC, q, i, f"q{q}-m{i}".encode()) for q in range(SHARDS) for i in range(3)]
    rows += [(OTHER, 0, 0, b"o0"), (OTHER, 0, 1, b"o1")]
    return [r for r in rows if topic is None or r[0] == topic]


def test_the_commit_log_and_messages_views_union_every_shard(spark_reads: Any, sharded: Store) -> None:
    register_views(spark_reads, sharded, ["commit_log", "messages"])
    late = next(q for q in range(SHARDS) if shard_of_queue(TOPIC, q, SHARDS) == 2)
    everything = [*_dispatched(), (TOPIC, late, 3, b"undispatched")]
    columns = "topic, queue_id, queue_offset, body"
    assert_df_equality(
        spark_reads.sql(f"SELECT {columns} FROM commit_log"),
        _expected(spark_reads, everything),
        ignore_row_order=True,
        ignore_nullable=True,
    )
    assert_df_equality(
        spark_reads.sql(f"SELECT {columns} FROM messages"),
        _expected(spark_reads, _dispatched()),
        ignore_row_order=True,
        ignore_nullable=True,
    )


def test_a_replay_reads_the_topic_from_every_shard(spark_reads: Any, sharded: Store) -> None:
    frame = replay(spark_reads, sharded, TOPIC).select("topic", "queue_id", "queue_offset", "body")
    assert_df_equality(
        frame, _expected(spark_reads, _dispatched(TOPIC)), ignore_row_order=True, ignore_nullable=True
    )


def test_a_replay_as_of_a_version_is_refused_on_a_sharded_store(spark: Any, sharded: Store) -> None:
    with pytest.raises(InvalidArgumentError, match="shards"):
        replay(spark, sharded, TOPIC, as_of_version=1)


def test_the_catalogs_commit_log_is_a_view_over_every_shards_table(
    spark: Any, sharded: Store, tmp_path_factory: pytest.TempPathFactory
) -> None:
    require_delta(spark)
    database = "lakemq_shards_catalog"
    registered = register_tables(spark, sharded, database, [schemas.COMMIT_LOG, schemas.TOPICS])
    assert registered == [
        f"{database}.commit_log_0",
        f"{database}.commit_log_1",
        f"{database}.commit_log_2",
        f"{database}.commit_log",
        f"{database}.topics",
    ]
    try:
        total = sum(sharded.read(n).num_rows for n in sharded.commit_logs)
        assert spark.table(f"{database}.commit_log").count() == total
        for k, name in enumerate(sharded.commit_logs):
            assert spark.table(f"{database}.commit_log_{k}").count() == sharded.read(name).num_rows
        assert register_tables(spark, sharded, database, ["commit_log_2"]) == [f"{database}.commit_log_2"]
    finally:
        spark.sql(f"DROP DATABASE {database} CASCADE")


def test_time_travel_and_history_name_one_shard(spark: Any, sharded: Store) -> None:
    require_delta(spark)
    assert table_as_of(spark, sharded, "commit_log_2", version=0).count() == 0
    latest = sharded.version("commit_log_2")
    assert (
        table_as_of(spark, sharded, "commit_log_2", version=latest).count()
        == sharded.read("commit_log_2").num_rows
    )
    assert history(spark, sharded, "commit_log_1").count() == sharded.version("commit_log_1") + 1
    with pytest.raises(InvalidArgumentError, match="commit_log_3"):
        history(spark, sharded, "commit_log_3")
