"""The ``mq`` data source: topics as Spark streams and batches, DataFrames sent as messages."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from chispa import assert_df_equality
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from engine import Admin, Message, Producer, PullConsumer, PullStatus, Store
from engine.broker.dispatch import dispatch_pending
from engine.errors import InvalidArgumentError, InvalidMessageError, InvalidTopicError, TopicNotFoundError
from engine.spark.mq_options import ReadOptions, WriteOptions
from engine.spark.mq_sink import check_sink_schema, commit_rows
from engine.spark.mq_source import MQStreamReader, share_budget, spark_message_schema
from engine.spark.sink_rows import ROWS_SCHEMA, normalize_rows
from engine.store import schemas
from engine.store.consumer_offset import OffsetStore

SINK_SCHEMA = "topic string, body binary, tags string, keys array<string>, properties map<string,string>"


def _send(store: Store, topic: str, n: int, start: int = 0) -> None:
    with Producer(store) as producer:
        for i in range(start, start + n):
            producer.send(Message(topic, f"m{i}".encode(), tags="A" if i % 2 else "B"))
    dispatch_pending(store)


def _rows(store: Store, **columns: Any) -> pa.Table:
    base = {"topic": ["T"], "body": [b"x"], "tags": [None], "keys": [None], "properties": [None]}
    base.update(columns)
    n = len(base["topic"])
    base["born_ts_ms"] = [1] * n
    base.setdefault("queue_id", [None] * n)
    base.setdefault("sharding_key", [None] * n)
    return pa.table(base, schema=ROWS_SCHEMA)


# ----------------------------------------------------------------- without a JVM
def test_read_options_are_validated_with_typed_errors() -> None:
    with pytest.raises(InvalidArgumentError, match="store"):
        ReadOptions.parse({"topic": "T"}, streaming=True)
    with pytest.raises(InvalidArgumentError, match="topic"):
        ReadOptions.parse({"store": "/s"}, streaming=True)
    with pytest.raises(InvalidTopicError):
        ReadOptions.parse({"store": "/s", "topic": "bad topic"}, streaming=True)
    with pytest.raises(InvalidArgumentError, match="startingOffsets"):
        ReadOptions.parse({"store": "/s", "topic": "T", "startingOffsets": "yesterday"}, streaming=True)
    with pytest.raises(InvalidArgumentError, match="maxMessagesPerTrigger"):
        ReadOptions.parse({"store": "/s", "topic": "T", "maxMessagesPerTrigger": "0"}, streaming=True)
    with pytest.raises(InvalidArgumentError, match="not for streaming"):
        ReadOptions.parse({"store": "/s", "topic": "T", "endTime": "5"}, streaming=True)
    with pytest.raises(InvalidArgumentError, match="not for batch"):
        ReadOptions.parse({"store": "/s", "topic": "T", "group": "g"}, streaming=False)
    with pytest.raises(InvalidArgumentError, match="exclude each other"):
        ReadOptions.parse(
            {"store": "/s", "topic": "T", "startTime": "1", "startingOffsets": "earliest"}, streaming=False
        )
    with pytest.raises(InvalidArgumentError, match="expression"):
        ReadOptions.parse({"store": "/s", "topic": "T", "expression": "A ||"}, streaming=True)
    with pytest.raises(InvalidArgumentError, match="group"):
        ReadOptions.parse({"store": "/s", "topic": "T", "group": "no spaces"}, streaming=True)
    opts = ReadOptions.parse(
        {"STORE": "/s", "Topic": "T", "startingOffsets": '{"q": {"0": 3}}', "maxMessagesPerTrigger": "9"},
        streaming=True,
    )
    assert (opts.store.root, opts.starting, opts.max_messages_per_trigger) == ("/s", {0: 3}, 9)
    assert (
        ReadOptions.parse(
            {"store": "/s", "topic": "T", "startingOffsets": "1700000000000"}, streaming=True
        ).starting
        == 1700000000000
    )


def test_write_options_need_a_sink_id_for_streams() -> None:
    with pytest.raises(InvalidArgumentError, match="sinkId"):
        WriteOptions.parse({"store": "/s"}, streaming=True)
    with pytest.raises(InvalidArgumentError, match="sinkId"):
        WriteOptions.parse({"store": "/s", "sinkId": "has space"}, streaming=True)
    with pytest.raises(InvalidArgumentError, match="batchId needs sinkId"):
        WriteOptions.parse({"store": "/s", "batchId": "3"}, streaming=False)
    assert WriteOptions.parse({"store": "/s", "sinkId": "orders"}, streaming=True).app_id == "mq.sink.orders"


def test_sink_schema_is_checked() -> None:
    from pyspark.sql.types import ArrayType, BinaryType, IntegerType, StringType, StructField, StructType

    def struct(**types: Any) -> StructType:
        return StructType([StructField(name, kind) for name, kind in types.items()])

    text, binary = StringType(), BinaryType()
    check_sink_schema(struct(topic=text, body=binary, keys=ArrayType(text), queue_id=IntegerType()))
    check_sink_schema(struct(topic=text, body=text))
    with pytest.raises(InvalidArgumentError, match="needs columns"):
        check_sink_schema(struct(topic=text))
    with pytest.raises(InvalidArgumentError, match="does not know column 'colour'"):
        check_sink_schema(struct(topic=text, body=binary, colour=text))
    with pytest.raises(InvalidArgumentError, match="'keys' must be"):
        check_sink_schema(struct(topic=text, body=binary, keys=text))


def test_bad_rows_fail_with_typed_errors() -> None:
    with pytest.raises(InvalidMessageError, match="body is empty"):
        normalize_rows(pa.record_batch({"topic": ["T", "T"], "body": [b"ok", b""]}), 1)
    with pytest.raises(InvalidMessageError, match="'\\|\\|'"):
        normalize_rows(pa.record_batch({"topic": ["T"], "body": ["x"], "tags": ["A||B"]}), 1)
    rows = normalize_rows(pa.record_batch({"topic": ["T"], "body": ["héllo"]}), 7)
    assert rows.to_pylist()[0]["body"] == "héllo".encode() and rows.schema == ROWS_SCHEMA


def test_commit_rows_is_all_or_nothing_and_idempotent_per_batch_id(store: Store, topic: str) -> None:
    before = store.version(schemas.COMMIT_LOG)
    with pytest.raises(TopicNotFoundError):
        commit_rows(
            store,
            _rows(
                store,
                topic=["T", "NOPE"],
                body=[b"a", b"b"],
                tags=[None, None],
                keys=[None, None],
                properties=[None, None],
            ),
            "mq.sink.s",
            0,
        )
    with pytest.raises(InvalidArgumentError, match="queue_id 9"):
        commit_rows(store, _rows(store, queue_id=[9]), "mq.sink.s", 0)
    assert store.version(schemas.COMMIT_LOG) == before  # nothing written
    assert len(commit_rows(store, _rows(store, queue_id=[1]), "mq.sink.s", 0)) == 1
    assert commit_rows(store, _rows(store, queue_id=[1]), "mq.sink.s", 0) == []  # replayed batch
    assert len(commit_rows(store, _rows(store, queue_id=[1]), "mq.sink.s", 1)) == 1
    with pytest.raises(InvalidArgumentError, match="checkpoint was reset"):
        commit_rows(store, _rows(store, queue_id=[1]), "mq.sink.s", 0)
    assert store.version(schemas.COMMIT_LOG) == before + 2


def test_budget_is_shared_across_queues_with_a_backlog() -> None:
    assert share_budget({0: 0, 1: 0, 2: 5}, {0: 10, 1: 1, 2: 5}, 6) == {0: 5, 1: 1, 2: 5}
    assert share_budget({0: 0, 1: 0}, {0: 3, 1: 3}, 100) == {0: 3, 1: 3}
    assert sum(share_budget({0: 0, 1: 0, 2: 0}, {0: 9, 1: 9, 2: 9}, 4).values()) == 4


def test_stream_reader_offsets_and_group_commits(store: Store, topic: str) -> None:
    _send(store, topic, 8)  # 2 per queue
    opts = ReadOptions.parse(
        {"store": store.root, "topic": topic, "group": "g", "startingOffsets": "earliest"}, streaming=True
    )
    reader = MQStreamReader(opts, spark_message_schema())
    start = reader.initialOffset()
    assert start == {"q": {"0": 0, "1": 0, "2": 0, "3": 0}}
    assert OffsetStore(store, "g").read(topic) == {
        (topic, q): 0 for q in range(4)
    }  # the start is the group's
    end = reader.latestOffset(start, ReadMaxRows(3))
    assert sum(end["q"].values()) == 3
    assert reader.latestOffset(start, ReadAllAvailable()) == {"q": {"0": 2, "1": 2, "2": 2, "3": 2}}
    assert [(p.queue_id, p.start, p.end) for p in reader.partitions(start, end)] == [
        (q, 0, end["q"][str(q)]) for q in range(4) if end["q"][str(q)]
    ]
    assert OffsetStore(store, "g").read(topic)[(topic, 0)] == 0  # nothing committed before the sink
    reader.commit(end)
    assert {q: o for (_, q), o in OffsetStore(store, "g").read(topic).items()} == {
        int(q): o for q, o in end["q"].items()
    }
    # A new reader (fresh checkpoint) starts where the group is.
    again = MQStreamReader(opts, spark_message_schema())
    assert again.initialOffset() == end


# ----------------------------------------------------------------- with Spark
def _run_stream(
    spark: Any, store: Store, checkpoint: Path, group: str = "g", **options: str
) -> list[tuple[int, int]]:
    """Read the topic with Trigger.AvailableNow into a list; (queue_id, queue_offset) per row."""
    seen: list[tuple[int, int]] = []
    reader = (
        spark.readStream.format("mq").option("store", store.root).option("topic", "T").option("group", group)
    )
    for key, value in options.items():
        reader = reader.option(key, value)
    query = (
        reader.load()
        .writeStream.foreachBatch(
            lambda df, _: seen.extend((r.queue_id, r.queue_offset) for r in df.collect())
        )
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return seen


def _all_offsets(store: Store) -> list[tuple[int, int]]:
    return sorted((r["queue_id"], r["queue_offset"]) for r in store.read(schemas.CONSUME_QUEUE).to_pylist())


@pytest.mark.spark
def test_stream_stopped_and_restarted_sees_every_message_exactly_once(
    spark: Any, store: Store, topic: str, tmp_path: Path
) -> None:
    _send(store, topic, 6)
    first = _run_stream(spark, store, tmp_path / "ck", startingOffsets="earliest", maxMessagesPerTrigger="4")
    assert sorted(first) == _all_offsets(store)
    _send(store, topic, 5, start=6)
    second = _run_stream(spark, store, tmp_path / "ck")  # same checkpoint
    _send(store, topic, 3, start=11)
    third = _run_stream(spark, store, tmp_path / "fresh")  # new checkpoint: the group's offsets
    everything = first + second + third
    assert len(everything) == 14 and sorted(everything) == _all_offsets(store)
    committed = OffsetStore(store, "g").read(topic)
    assert committed == {(topic, q): Admin(store).topic_stats(topic)[q].max_offset for q in range(4)}


@pytest.mark.spark
def test_group_offsets_move_only_after_the_sink_committed(
    spark: Any, store: Store, topic: str, tmp_path: Path
) -> None:
    _send(store, topic, 4)

    def failing_sink(df: Any, batch_id: int) -> None:
        raise RuntimeError("sink down")

    query = (
        spark.readStream.format("mq")
        .options(store=store.root, topic=topic, group="g", startingOffsets="earliest")
        .load()
        .writeStream.foreachBatch(failing_sink)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    with pytest.raises(Exception, match="sink down"):
        query.awaitTermination()
    assert OffsetStore(store, "g").read(topic) == {(topic, q): 0 for q in range(4)}
    assert sorted(_run_stream(spark, store, tmp_path / "ck2")) == _all_offsets(store)  # nothing skipped


@pytest.mark.spark
def test_batch_read_with_tag_filter_and_offset_bounds(spark: Any, store: Store, topic: str) -> None:
    _send(store, topic, 8)
    df = (
        spark.read.format("mq")
        .options(
            store=store.root,
            topic=topic,
            expression="A",
            startingOffsets='{"0": 1}',
            endingOffsets='{"q": {"3": 1}}',
        )
        .load()
    )
    expected = spark.createDataFrame(
        [
            (r["queue_id"], r["queue_offset"], bytes(r["body"]), r["tags"])
            for r in store.read(schemas.COMMIT_LOG).to_pylist()
            if r["tags"] == "A"
            and not (r["queue_id"] == 0 and r["queue_offset"] < 1)
            and not (r["queue_id"] == 3 and r["queue_offset"] >= 1)
        ],
        "queue_id int, queue_offset long, body binary, tags string",
    )
    actual = df.select("queue_id", "queue_offset", "body", "tags")
    assert_df_equality(actual, expected, ignore_row_order=True, ignore_nullable=True)
    assert dict(df.dtypes)["store_ts"] == "timestamp"


@pytest.mark.spark
def test_dataframe_written_with_mq_is_pullable(spark: Any, store: Store, topic: str) -> None:
    rows = [("T", f"b{i}".encode(), "TagA", [f"k{i}"], {"p": str(i)}, 2) for i in range(3)]
    df = spark.createDataFrame(rows, SINK_SCHEMA + ", queue_id int")
    df.write.format("mq").option("store", store.root).mode("append").save()
    dispatch_pending(store)
    result = PullConsumer(store, "g").pull(topic, 2, 0, max_nums=10)
    assert result.status is PullStatus.FOUND
    got = [(m.queue_offset, m.body, m.tags, m.keys, m.properties["p"]) for m in result.messages]
    assert sorted(got) == [(i, f"b{i}".encode(), "TagA", (f"k{i}",), str(i)) for i in range(3)]
    assert result.next_begin_offset == 3


@pytest.mark.spark
def test_bad_rows_fail_the_write_and_write_nothing(spark: Any, store: Store, topic: str) -> None:
    before = store.version(schemas.COMMIT_LOG)
    bad_body = spark.createDataFrame([("T", b"ok"), ("T", b"")], "topic string, body binary")
    with pytest.raises(Exception, match="InvalidMessageError"):
        bad_body.write.format("mq").option("store", store.root).mode("append").save()
    unknown = spark.createDataFrame([("T", b"ok"), ("NOPE", b"x")], "topic string, body binary")
    with pytest.raises(Exception, match="TopicNotFoundError"):
        unknown.write.format("mq").option("store", store.root).mode("append").save()
    with pytest.raises(Exception, match="overwrite"):
        unknown.write.format("mq").option("store", store.root).mode("overwrite").save()
    assert store.version(schemas.COMMIT_LOG) == before


@pytest.mark.spark
def test_stream_to_mq_sink_is_exactly_once_when_a_batch_is_replayed(
    spark: Any, store: Store, topic: str, tmp_path: Path
) -> None:
    Admin(store).create_topic("OUT", 1)
    _send(store, topic, 5)
    checkpoint = tmp_path / "ck"

    def run() -> None:
        query = (
            spark.readStream.format("mq")
            .option("store", store.root)
            .option("topic", topic)
            .option("startingOffsets", "earliest")
            .load()
            .selectExpr("'OUT' AS topic", "body", "tags")
            .writeStream.format("mq")
            .option("store", store.root)
            .option("sinkId", "copy")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()

    run()
    dispatch_pending(store)
    assert Admin(store).topic_stats("OUT")[0].max_offset == 5
    # A crash after the sink committed but before Spark recorded the batch: Spark runs it again.
    last = max(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    (checkpoint / "commits" / str(last)).unlink()
    (checkpoint / "commits" / f".{last}.crc").unlink(missing_ok=True)
    run()
    dispatch_pending(store)
    assert Admin(store).topic_stats("OUT")[0].max_offset == 5
    copied = sorted(m.body for m in PullConsumer(store, "g").pull("OUT", 0, 0, max_nums=10).messages)
    assert copied == sorted(f"m{i}".encode() for i in range(5))


@pytest.mark.spark
def test_stream_options_errors_are_typed(spark: Any, store: Store, topic: str, tmp_path: Path) -> None:
    df = spark.createDataFrame([("T", b"x")], "topic string, body binary")
    query = (
        spark.readStream.format("mq")
        .option("store", store.root)
        .option("topic", topic)
        .load()
        .selectExpr("topic", "body")
        .writeStream.format("mq")
        .option("store", store.root)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    with pytest.raises(Exception, match=r"InvalidArgumentError.*sinkId"):
        query.awaitTermination()
    with pytest.raises(Exception, match=r"InvalidArgumentError.*startingOffsets"):
        spark.read.format("mq").option("store", store.root).option("topic", topic).option(
            "startingOffsets", "soon"
        ).load().collect()
    with pytest.raises(Exception, match=r"StoreError.*no store"):
        spark.read.format("mq").option("store", str(tmp_path / "nowhere")).option(
            "topic", topic
        ).load().collect()
    assert df.count() == 1


@pytest.fixture(autouse=True)
def _no_leftover_queries(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if "spark" in request.fixturenames:
        for query in request.getfixturevalue("spark").streams.active:
            query.stop()
