"""Bad input at every public entry point: a typed error that says what was wrong, no new table version.

The project's rule: "Every bad input gets a typed error from one hierarchy (``engine.errors``), says what
was wrong and what is allowed, and changes no table." Each case below calls one public entry point
(the names of ``engine.__all__``, the ``mq`` data source's options and the ``mq`` command line) with
one bad argument and asserts:

- the exception is exactly the documented :class:`~engine.errors.MQError` subclass (never a
  ``TypeError``, ``ValueError``, ``KeyError`` or an Arrow / delta-rs error leaking out);
- its message names what was wrong (a fragment of the expected text);
- the Delta version of every table of the store is the one it was before the call.

The cases share one store (module scope) holding acknowledged messages; at the end the history of
those messages is checked (none lost or duplicated by the bad calls) and recorded for FAULTS.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from deltalake import write_deltalake

import engine
from engine import (
    Admin,
    ConfigError,
    ConsumerClosedError,
    ConsumerError,
    EngineConfig,
    InvalidArgumentError,
    InvalidMessageError,
    InvalidSelectorError,
    InvalidTopicError,
    LocalTransactionState,
    Message,
    MessageExt,
    MessageNotFoundError,
    MQError,
    OffsetOutOfRangeError,
    Producer,
    ProducerClosedError,
    PullConsumer,
    PushConsumer,
    SimpleConsumer,
    Store,
    StoreError,
    TopicExistsError,
    TopicNotFoundError,
    TopicShrinkError,
    TransactionProducer,
    load_config,
)
from engine.broker.dispatch import dispatch_pending
from engine.cli import main as mq_main
from engine.errors import InvalidReceiptHandleError
from engine.protocol import MAX_BODY_BYTES, SCHEDULE_TOPIC
from engine.spark.mq_options import ReadOptions, WriteOptions
from tests.fault.history import HistoryLog, check, make_body, record
from tests.helpers import versions

pytestmark = pytest.mark.fault

TOPIC = "T"
READ_ONLY = "RO"
QUEUES = 4
GROUP = "g-bad-input"


@dataclass
class Env:
    """A store with a few acknowledged messages and one client of every kind."""

    root: Path
    store: Store
    admin: Admin
    producer: Producer
    closed_producer: Producer
    puller: PullConsumer
    simple: SimpleConsumer
    closed_simple: SimpleConsumer
    held: MessageExt
    tx: TransactionProducer
    log: HistoryLog
    tmp: Path


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp("bad-input")
    store = Store.open(tmp / "mqdata")
    admin = Admin(store)
    admin.create_topic(TOPIC, QUEUES)
    admin.create_topic(READ_ONLY, 1, perm=4)
    admin.ensure_schedule_topic()
    log = HistoryLog(tmp / "history" / "producer.jsonl")
    producer = Producer(store, "bad-input")
    for i in range(8):
        mid = f"m{i}"
        log.sent([mid])
        producer.send(Message(TOPIC, make_body(mid), tags="TagA"), queue_id=i % QUEUES)
        log.acknowledged([mid])
    dispatch_pending(store)
    closed_producer = Producer(store, "closed")
    closed_producer.close()
    simple = SimpleConsumer(store, GROUP, "c1", ack_linger_ms=0)
    simple.subscribe(TOPIC)
    [held] = simple.receive(1, 600_000)
    closed_simple = SimpleConsumer(store, GROUP, "c2")
    closed_simple.close()
    tx = TransactionProducer(
        store, lambda m: LocalTransactionState.COMMIT, "tx-bad-input", check_poll_ms=60_000
    )
    yield Env(
        tmp / "mqdata",
        store,
        admin,
        producer,
        closed_producer,
        PullConsumer(store, GROUP),
        simple,
        closed_simple,
        held,
        tx,
        log,
        tmp,
    )
    tx.close()
    simple.close()
    producer.close()
    log.close()


# ----------------------------------------------------------------------------- the cases
Call = Callable[[Env], object]


@dataclass(frozen=True)
class Case:
    id: str
    call: Call
    error: type[MQError]
    says: str  # a fragment of the message (case-insensitive)


def msg(**fields: Any) -> Message:
    base: dict[str, Any] = {"topic": TOPIC, "body": b"ok"}
    base.update(fields)
    return Message(**base)


def not_held(e: Env) -> MessageExt:
    """A message of the topic (queue 3, offset 1) that this consumer never received."""
    return MessageExt(TOPIC, 3, 1, 0, "X" * 32, "u", b"x", None, (), {}, 0, 0, 0)


def send(**fields: Any) -> Call:
    return lambda e: e.producer.send(msg(**fields))


TOO_BIG = b"x" * (MAX_BODY_BYTES + 1)
LONG_NAME = "t" * 128
OTHER_STORE_ID = "0123456789ABCDEF0000000000000000"

MESSAGE_CASES = [
    Case("body-str", send(body="text"), InvalidMessageError, "body must be bytes"),
    Case("body-none", send(body=None), InvalidMessageError, "body must be bytes"),
    Case("body-empty", send(body=b""), InvalidMessageError, "body is empty"),
    Case("body-too-large", send(body=TOO_BIG), InvalidMessageError, "at most 4194304"),
    Case("topic-empty", send(topic=""), InvalidTopicError, "non-empty"),
    Case("topic-none", send(topic=None), InvalidTopicError, "non-empty string"),
    Case("topic-int", send(topic=7), InvalidTopicError, "non-empty string"),
    Case("topic-list", send(topic=["T"]), InvalidTopicError, "non-empty string"),
    Case("topic-too-long", send(topic=LONG_NAME), InvalidTopicError, "at most 127"),
    Case("topic-illegal-chars", send(topic="a b/c"), InvalidTopicError, "characters outside"),
    Case("topic-unknown", send(topic="Nope"), TopicNotFoundError, "does not exist"),
    Case("topic-schedule", send(topic=SCHEDULE_TOPIC), InvalidMessageError, "system topic"),
    Case("topic-retry", send(topic="%RETRY%g"), InvalidMessageError, "system topic"),
    Case("topic-dlq", send(topic="%DLQ%g"), InvalidMessageError, "system topic"),
    Case("topic-rmq-sys", send(topic="rmq_sys_x"), InvalidMessageError, "system topic"),
    Case("topic-read-only", send(topic=READ_ONLY), InvalidMessageError, "not writable"),
    Case("tags-empty", send(tags=""), InvalidMessageError, "tags must be"),
    Case("tags-int", send(tags=5), InvalidMessageError, "tags must be"),
    Case("tags-separator", send(tags="A||B"), InvalidMessageError, "'||'"),
    Case("keys-str", send(keys="k1"), InvalidMessageError, "keys must be a sequence"),
    Case("keys-int", send(keys=5), InvalidMessageError, "keys must be a sequence"),
    Case("key-empty", send(keys=("",)), InvalidMessageError, "non-empty string without whitespace"),
    Case("key-space", send(keys=("a b",)), InvalidMessageError, "without whitespace"),
    Case("key-int", send(keys=(1,)), InvalidMessageError, "non-empty string"),
    Case("props-not-mapping", send(properties="a=b"), InvalidMessageError, "mapping"),
    Case("props-int-value", send(properties={"a": 1}), InvalidMessageError, "strings only"),
    Case("props-int-name", send(properties={1: "a"}), InvalidMessageError, "strings only"),
    Case("props-empty-name", send(properties={"": "v"}), InvalidMessageError, "empty"),
    Case("props-separator", send(properties={"a\x01": "v"}), InvalidMessageError, "separators"),
    Case("props-reserved-delay", send(properties={"DELAY": "3"}), InvalidMessageError, "reserved"),
    Case("props-reserved-real-topic", send(properties={"REAL_TOPIC": "X"}), InvalidMessageError, "reserved"),
    Case("props-reserved-tran", send(properties={"TRAN_MSG": "true"}), InvalidMessageError, "reserved"),
    Case("props-reserved-uniq", send(properties={"UNIQ_KEY": "u"}), InvalidMessageError, "reserved"),
    Case("deliver-negative", send(deliver_at_ms=-5), InvalidMessageError, "deliver_at_ms"),
    Case("deliver-bool", send(deliver_at_ms=True), InvalidMessageError, "deliver_at_ms"),
    Case("deliver-str", send(deliver_at_ms="soon"), InvalidMessageError, "deliver_at_ms"),
    Case(
        "deliver-beyond-3-days",
        send(deliver_at_ms=int(time.time() * 1000) + 4 * 86_400_000),
        InvalidMessageError,
        "timer_max_delay_sec",
    ),
]

PRODUCER_CASES = [
    Case(
        "send-not-a-message",
        lambda e: e.producer.send("hello"),
        InvalidMessageError,
        "expected engine.Message",
    ),
    Case(
        "send-queue-out-of-range",
        lambda e: e.producer.send(msg(), queue_id=QUEUES),
        InvalidArgumentError,
        "out of range",
    ),
    Case(
        "send-queue-negative",
        lambda e: e.producer.send(msg(), queue_id=-1),
        InvalidArgumentError,
        "out of range",
    ),
    Case(
        "send-queue-str", lambda e: e.producer.send(msg(), queue_id="0"), InvalidArgumentError, "out of range"
    ),
    Case(
        "send-queue-huge",
        lambda e: e.producer.send(msg(), queue_id=2**70),
        InvalidArgumentError,
        "out of range",
    ),
    Case(
        "send-sharding-key-empty",
        lambda e: e.producer.send(msg(), sharding_key=""),
        InvalidArgumentError,
        "sharding_key",
    ),
    Case(
        "send-sharding-key-int",
        lambda e: e.producer.send(msg(), sharding_key=3),
        InvalidArgumentError,
        "sharding_key",
    ),
    Case(
        "send-delay-negative", lambda e: e.producer.send(msg(), delay_level=-1), InvalidArgumentError, "1..18"
    ),
    Case("send-delay-str", lambda e: e.producer.send(msg(), delay_level="3"), InvalidArgumentError, "1..18"),
    Case("send-closed", lambda e: e.closed_producer.send(msg()), ProducerClosedError, "closed"),
    Case(
        "producer-batch-size-0", lambda e: Producer(e.store, batch_size=0), InvalidArgumentError, "batch_size"
    ),
    Case(
        "producer-linger-negative",
        lambda e: Producer(e.store, linger_ms=-1),
        InvalidArgumentError,
        "linger_ms",
    ),
    Case(
        "producer-linger-str", lambda e: Producer(e.store, linger_ms="5"), InvalidArgumentError, "linger_ms"
    ),
    Case("producer-group-int", lambda e: Producer(e.store, group=5), InvalidArgumentError, "group"),
    Case(
        "producer-lock-wait-negative",
        lambda e: Producer(e.store, lock_wait_s=-1),
        InvalidArgumentError,
        "lock_wait_s",
    ),
    Case("flush-timeout-str", lambda e: e.producer.flush("1s"), InvalidArgumentError, "timeout"),
    Case("flush-timeout-negative", lambda e: e.producer.flush(-1), InvalidArgumentError, "timeout"),
    Case(
        "batch-not-sequence",
        lambda e: e.producer.send_batch(msg()),
        InvalidMessageError,
        "sequence of Message",
    ),
    Case(
        "batch-of-str",
        lambda e: e.producer.send_batch([msg(), "x"]),
        InvalidMessageError,
        "exactly one topic",
    ),
    Case(
        "batch-mixed-topics",
        lambda e: e.producer.send_batch([msg(), msg(topic=READ_ONLY)]),
        InvalidMessageError,
        "exactly one topic",
    ),
    Case(
        "batch-mixed-types",
        lambda e: e.producer.send_batch([msg(), msg(topic=5)]),
        InvalidMessageError,
        "exactly one topic",
    ),
    Case(
        "batch-unhashable-topic",
        lambda e: e.producer.send_batch([msg(topic=["T"])]),
        InvalidTopicError,
        "non-empty string",
    ),
    Case(
        "batch-delayed",
        lambda e: e.producer.send_batch([msg(deliver_at_ms=1)]),
        InvalidMessageError,
        "delayed",
    ),
    Case(
        "batch-too-large",
        lambda e: e.producer.send_batch([msg(body=b"x" * (3 << 20))] * 2),
        InvalidMessageError,
        "at most",
    ),
    Case(
        "batch-unknown-topic",
        lambda e: e.producer.send_batch([msg(topic="Nope")]),
        TopicNotFoundError,
        "does not exist",
    ),
    Case(
        "batch-system-topic",
        lambda e: e.producer.send_batch([msg(topic="%DLQ%g")]),
        InvalidMessageError,
        "system topic",
    ),
    Case(
        "batch-bad-topic",
        lambda e: e.producer.send_batch([msg(topic="a b")]),
        InvalidTopicError,
        "characters outside",
    ),
    Case(
        "batch-one-bad-body",
        lambda e: e.producer.send_batch([msg(), msg(body="s")]),
        InvalidMessageError,
        "body must be bytes",
    ),
    Case(
        "batch-reserved-property",
        lambda e: e.producer.send_batch([msg(properties={"DELAY": "1"})]),
        InvalidMessageError,
        "reserved",
    ),
    Case(
        "batch-queue-out-of-range",
        lambda e: e.producer.send_batch([msg()], queue_id=9),
        InvalidArgumentError,
        "out of range",
    ),
    Case(
        "async-bad-body", lambda e: e.producer.send_async(msg(body=b"")), InvalidMessageError, "body is empty"
    ),
    Case(
        "async-unknown-topic",
        lambda e: e.producer.send_async(msg(topic="Nope")),
        TopicNotFoundError,
        "does not exist",
    ),
    Case(
        "async-queue-out-of-range",
        lambda e: e.producer.send_async(msg(), queue_id=99),
        InvalidArgumentError,
        "out of range",
    ),
    Case("async-closed", lambda e: e.closed_producer.send_async(msg()), ProducerClosedError, "closed"),
]

PULL_CASES = [
    Case("pull-group-empty", lambda e: PullConsumer(e.store, ""), InvalidArgumentError, "group"),
    Case("pull-group-space", lambda e: PullConsumer(e.store, "a b"), InvalidArgumentError, "group"),
    Case("pull-group-int", lambda e: PullConsumer(e.store, 5), InvalidArgumentError, "group"),
    Case(
        "pull-group-too-long", lambda e: PullConsumer(e.store, "g" * 256), InvalidArgumentError, "at most 255"
    ),
    Case("pull-unknown-topic", lambda e: e.puller.pull("Nope", 0, 0), TopicNotFoundError, "does not exist"),
    Case("pull-topic-int", lambda e: e.puller.pull(5, 0, 0), InvalidTopicError, "topic"),
    Case("pull-topic-list", lambda e: e.puller.pull(["T"], 0, 0), InvalidTopicError, "topic"),
    Case(
        "pull-queue-out-of-range",
        lambda e: e.puller.pull(TOPIC, QUEUES, 0),
        InvalidArgumentError,
        "out of range",
    ),
    Case("pull-queue-negative", lambda e: e.puller.pull(TOPIC, -1, 0), InvalidArgumentError, "out of range"),
    Case("pull-queue-bool", lambda e: e.puller.pull(TOPIC, True, 0), InvalidArgumentError, "out of range"),
    Case("pull-offset-str", lambda e: e.puller.pull(TOPIC, 0, "0"), InvalidArgumentError, "must be an int"),
    Case("pull-offset-float", lambda e: e.puller.pull(TOPIC, 0, 1.5), InvalidArgumentError, "must be an int"),
    Case("pull-max-0", lambda e: e.puller.pull(TOPIC, 0, 0, 0), InvalidArgumentError, "1..1024"),
    Case("pull-max-overflow", lambda e: e.puller.pull(TOPIC, 0, 0, 1025), InvalidArgumentError, "1..1024"),
    Case(
        "pull-expression-empty-tag",
        lambda e: e.puller.pull(TOPIC, 0, 0, expression="A ||"),
        InvalidSelectorError,
        "empty tag",
    ),
    Case(
        "pull-expression-int",
        lambda e: e.puller.pull(TOPIC, 0, 0, expression=5),
        InvalidSelectorError,
        "expression",
    ),
    Case(
        "pull-suspend-negative",
        lambda e: e.puller.pull(TOPIC, 0, 0, suspend_ms=-1),
        InvalidArgumentError,
        "suspend_ms",
    ),
    Case(
        "commit-offset-negative", lambda e: e.puller.commit_offset(TOPIC, 0, -1), InvalidArgumentError, ">= 0"
    ),
    Case(
        "commit-offset-overflow",
        lambda e: e.puller.commit_offset(TOPIC, 0, 2**70),
        InvalidArgumentError,
        "64-bit",
    ),
    Case(
        "commit-offset-str",
        lambda e: e.puller.commit_offset(TOPIC, 0, "3"),
        InvalidArgumentError,
        "must be an int",
    ),
    Case(
        "commit-offset-bad-queue",
        lambda e: e.puller.commit_offset(TOPIC, 9, 0),
        InvalidArgumentError,
        "out of range",
    ),
    Case(
        "commit-offset-unknown-topic",
        lambda e: e.puller.commit_offset("Nope", 0, 0),
        TopicNotFoundError,
        "does not exist",
    ),
    Case(
        "committed-offset-bad-queue",
        lambda e: e.puller.committed_offset(TOPIC, -2),
        InvalidArgumentError,
        "out of range",
    ),
    Case(
        "max-offset-unknown-topic",
        lambda e: e.puller.max_offset("Nope", 0),
        TopicNotFoundError,
        "does not exist",
    ),
    Case(
        "min-offset-bad-queue", lambda e: e.puller.min_offset(TOPIC, 4), InvalidArgumentError, "out of range"
    ),
]


def push(e: Env, **kwargs: Any) -> PushConsumer:
    return PushConsumer(e.store, kwargs.pop("group", "g-push"), **kwargs)


PUSH_CASES = [
    Case("push-group-bad", lambda e: push(e, group="a b"), InvalidArgumentError, "group"),
    Case("push-model-unknown", lambda e: push(e, model="BOTH"), InvalidArgumentError, "model must be one of"),
    Case(
        "push-consume-from-unknown",
        lambda e: push(e, consume_from="MIDDLE"),
        InvalidArgumentError,
        "consume_from",
    ),
    Case("push-allocate-unknown", lambda e: push(e, allocate="random"), InvalidArgumentError, "allocate"),
    Case(
        "push-timestamp-negative",
        lambda e: push(e, consume_from_timestamp_ms=-1),
        InvalidArgumentError,
        "consume_from_timestamp_ms",
    ),
    Case(
        "push-max-reconsume-below-minus-one",
        lambda e: push(e, max_reconsume_times=-2),
        InvalidArgumentError,
        "max_reconsume_times",
    ),
    Case("push-pull-batch-0", lambda e: push(e, pull_batch_size=0), InvalidArgumentError, "pull_batch_size"),
    Case(
        "push-consume-batch-overflow",
        lambda e: push(e, consume_message_batch_max_size=5000),
        InvalidArgumentError,
        "at most",
    ),
    Case(
        "push-heartbeat-str",
        lambda e: push(e, heartbeat_interval_ms="1s"),
        InvalidArgumentError,
        "heartbeat_interval_ms",
    ),
    Case(
        "push-timeout-under-heartbeat",
        lambda e: push(e, member_timeout_ms=1000, heartbeat_interval_ms=2000),
        InvalidArgumentError,
        "must exceed",
    ),
    Case(
        "push-relock-over-half-ttl",
        lambda e: push(e, relock_interval_ms=40_000),
        InvalidArgumentError,
        "half",
    ),
    Case(
        "push-subscribe-bad-topic",
        lambda e: push(e).subscribe("a b"),
        InvalidTopicError,
        "characters outside",
    ),
    Case("push-subscribe-unknown", lambda e: push(e).subscribe("Nope"), TopicNotFoundError, "does not exist"),
    Case(
        "push-subscribe-bad-expression",
        lambda e: push(e).subscribe(TOPIC, "||"),
        InvalidSelectorError,
        "empty tag",
    ),
    Case(
        "push-listener-not-callable",
        lambda e: push(e).register_listener("fn"),
        InvalidArgumentError,
        "callable",
    ),
    Case("push-start-without-listener", lambda e: push(e).start(), ConsumerError, "listener"),
    Case(
        "push-start-without-subscription", lambda e: _listening(push(e)).start(), ConsumerError, "subscribe"
    ),
]


def _listening(consumer: PushConsumer) -> PushConsumer:
    consumer.register_listener(lambda msgs: engine.ConsumeResult.SUCCESS)
    return consumer


def simple(e: Env, **kwargs: Any) -> SimpleConsumer:
    return SimpleConsumer(e.store, kwargs.pop("group", "g-simple"), **kwargs)


SIMPLE_CASES = [
    Case("simple-group-bad", lambda e: simple(e, group=""), InvalidArgumentError, "group"),
    Case(
        "simple-consumer-id-empty", lambda e: simple(e, consumer_id=""), InvalidArgumentError, "consumer_id"
    ),
    Case(
        "simple-invisible-default-0",
        lambda e: simple(e, invisible_ms_default=0),
        InvalidArgumentError,
        "invisible_ms_default",
    ),
    Case(
        "simple-ack-linger-negative",
        lambda e: simple(e, ack_linger_ms=-1),
        InvalidArgumentError,
        "ack_linger_ms",
    ),
    Case(
        "simple-subscribe-unknown",
        lambda e: simple(e).subscribe("Nope"),
        TopicNotFoundError,
        "does not exist",
    ),
    Case("simple-subscribe-topic-int", lambda e: simple(e).subscribe(5), InvalidTopicError, "topic"),
    Case(
        "simple-subscribe-system",
        lambda e: simple(e).subscribe(SCHEDULE_TOPIC),
        InvalidArgumentError,
        "internal",
    ),
    Case(
        "simple-subscribe-bad-expression",
        lambda e: simple(e).subscribe(TOPIC, "A || "),
        InvalidSelectorError,
        "empty tag",
    ),
    Case("simple-unsubscribe-list", lambda e: e.simple.unsubscribe(["T"]), InvalidTopicError, "topic"),
    Case("simple-receive-unsubscribed", lambda e: simple(e).receive(), ConsumerError, "subscribe"),
    Case("simple-receive-max-0", lambda e: e.simple.receive(0), InvalidArgumentError, "max_nums"),
    Case("simple-receive-max-overflow", lambda e: e.simple.receive(2000), InvalidArgumentError, "max_nums"),
    Case(
        "simple-receive-invisible-0", lambda e: e.simple.receive(1, 0), InvalidArgumentError, "invisible_ms"
    ),
    Case(
        "simple-receive-invisible-13h",
        lambda e: e.simple.receive(1, 13 * 3_600_000),
        InvalidArgumentError,
        "invisible_ms",
    ),
    Case(
        "simple-receive-wait-negative",
        lambda e: e.simple.receive(1, wait_ms=-1),
        InvalidArgumentError,
        "wait_ms",
    ),
    Case("simple-receive-closed", lambda e: e.closed_simple.receive(), ConsumerClosedError, "closed"),
    Case("simple-ack-str", lambda e: e.simple.ack("msg"), InvalidArgumentError, "returned by receive"),
    Case("simple-ack-not-held", lambda e: e.simple.ack(not_held(e)), InvalidReceiptHandleError, "not held"),
    Case("simple-nack-not-held", lambda e: e.simple.nack(not_held(e)), InvalidReceiptHandleError, "not held"),
    Case(
        "simple-change-invisible-0",
        lambda e: e.simple.change_invisible_time(e.held, 0),
        InvalidArgumentError,
        "invisible_ms",
    ),
    Case(
        "simple-change-invisible-str",
        lambda e: e.simple.change_invisible_time(e.held, "1s"),
        InvalidArgumentError,
        "invisible_ms",
    ),
    Case(
        "simple-change-invisible-not-held",
        lambda e: e.simple.change_invisible_time(not_held(e), 1000),
        InvalidReceiptHandleError,
        "not held",
    ),
]


def commit(_: object) -> LocalTransactionState:
    return LocalTransactionState.COMMIT


TX_CASES = [
    Case(
        "tx-checker-not-callable",
        lambda e: TransactionProducer(e.store, "no"),
        InvalidArgumentError,
        "checker",
    ),
    Case(
        "tx-group-bad", lambda e: TransactionProducer(e.store, commit, "a b"), InvalidArgumentError, "group"
    ),
    Case(
        "tx-check-poll-0",
        lambda e: TransactionProducer(e.store, commit, check_poll_ms=0),
        InvalidArgumentError,
        "check_poll_ms",
    ),
    Case(
        "tx-check-poll-overflow",
        lambda e: TransactionProducer(e.store, commit, check_poll_ms=2**70),
        InvalidArgumentError,
        "check_poll_ms",
    ),
    Case(
        "tx-execute-not-callable",
        lambda e: e.tx.send_in_transaction(msg(), "no"),
        InvalidArgumentError,
        "execute",
    ),
    Case(
        "tx-timer-message",
        lambda e: e.tx.send_in_transaction(msg(deliver_at_ms=1), commit),
        InvalidMessageError,
        "cannot be delayed",
    ),
    Case(
        "tx-unknown-topic",
        lambda e: e.tx.send_in_transaction(msg(topic="Nope"), commit),
        TopicNotFoundError,
        "does not exist",
    ),
    Case(
        "tx-empty-body",
        lambda e: e.tx.send_in_transaction(msg(body=b""), commit),
        InvalidMessageError,
        "body is empty",
    ),
    Case(
        "tx-not-a-message",
        lambda e: e.tx.send_in_transaction(b"x", commit),
        InvalidMessageError,
        "expected engine.Message",
    ),
    Case(
        "tx-queue-out-of-range",
        lambda e: e.tx.send_in_transaction(msg(), commit, queue_id=7),
        InvalidArgumentError,
        "out of range",
    ),
]

ADMIN_CASES = [
    Case("create-topic-empty", lambda e: e.admin.create_topic(""), InvalidTopicError, "non-empty"),
    Case(
        "create-topic-too-long", lambda e: e.admin.create_topic(LONG_NAME), InvalidTopicError, "at most 127"
    ),
    Case(
        "create-topic-illegal", lambda e: e.admin.create_topic("a/b"), InvalidTopicError, "characters outside"
    ),
    Case("create-topic-int", lambda e: e.admin.create_topic(5), InvalidTopicError, "non-empty string"),
    Case(
        "create-topic-schedule", lambda e: e.admin.create_topic(SCHEDULE_TOPIC), InvalidTopicError, "reserved"
    ),
    Case("create-topic-retry", lambda e: e.admin.create_topic("%RETRY%g"), InvalidTopicError, "reserved"),
    Case("create-topic-rmq-sys", lambda e: e.admin.create_topic("RMQ_SYS_X"), InvalidTopicError, "reserved"),
    Case("create-topic-benchmark", lambda e: e.admin.create_topic("TBW102"), InvalidTopicError, "reserved"),
    Case("create-topic-queues-0", lambda e: e.admin.create_topic("N", 0), InvalidArgumentError, "1..1024"),
    Case(
        "create-topic-queues-overflow",
        lambda e: e.admin.create_topic("N", 1025),
        InvalidArgumentError,
        "1..1024",
    ),
    Case(
        "create-topic-queues-str", lambda e: e.admin.create_topic("N", "4"), InvalidArgumentError, "1..1024"
    ),
    Case(
        "create-topic-queues-bool", lambda e: e.admin.create_topic("N", True), InvalidArgumentError, "1..1024"
    ),
    Case(
        "create-topic-type",
        lambda e: e.admin.create_topic("N", 1, type="ODD"),
        InvalidArgumentError,
        "must be one of",
    ),
    Case("create-topic-perm", lambda e: e.admin.create_topic("N", 1, perm=3), InvalidArgumentError, "perm"),
    Case("create-topic-exists", lambda e: e.admin.create_topic(TOPIC, 2), TopicExistsError, "exists"),
    Case("topic-stats-unknown", lambda e: e.admin.topic_stats("Nope"), TopicNotFoundError, "does not exist"),
    Case("topic-stats-list", lambda e: e.admin.topic_stats(["T"]), InvalidTopicError, "topic"),
    Case("view-message-short", lambda e: e.admin.view_message("abc"), InvalidArgumentError, "32 hex"),
    Case(
        "view-message-not-hex",
        lambda e: e.admin.view_message(e.store.store_id + "Z" * 16),
        InvalidArgumentError,
        "not hex",
    ),
    Case("view-message-int", lambda e: e.admin.view_message(5), InvalidArgumentError, "32 hex"),
    Case(
        "view-message-other-store",
        lambda e: e.admin.view_message(OTHER_STORE_ID),
        InvalidArgumentError,
        "not to this store",
    ),
    Case(
        "view-message-nothing-there",
        lambda e: e.admin.view_message(e.store.store_id + "00000000000FFFFF"),
        MessageNotFoundError,
        "no message",
    ),
    Case(
        "query-key-unknown-topic",
        lambda e: e.admin.query_by_key("Nope", "k", 0, 1),
        TopicNotFoundError,
        "does not exist",
    ),
    Case(
        "query-key-space",
        lambda e: e.admin.query_by_key(TOPIC, "a b", 0, 1),
        InvalidArgumentError,
        "without whitespace",
    ),
    Case(
        "query-key-empty", lambda e: e.admin.query_by_key(TOPIC, "", 0, 1), InvalidArgumentError, "non-empty"
    ),
    Case(
        "query-key-negative-time",
        lambda e: e.admin.query_by_key(TOPIC, "k", -1, 1),
        InvalidArgumentError,
        ">= 0",
    ),
    Case(
        "query-key-reversed-range",
        lambda e: e.admin.query_by_key(TOPIC, "k", 10, 1),
        InvalidArgumentError,
        "end",
    ),
    Case(
        "query-key-time-overflow",
        lambda e: e.admin.query_by_key(TOPIC, "k", 0, 2**70),
        InvalidArgumentError,
        "64-bit",
    ),
    Case(
        "query-key-max-0",
        lambda e: e.admin.query_by_key(TOPIC, "k", 0, 1, 0),
        InvalidArgumentError,
        "max_num",
    ),
    Case(
        "query-uniq-empty", lambda e: e.admin.query_by_uniq_key(TOPIC, ""), InvalidArgumentError, "non-empty"
    ),
    Case(
        "query-uniq-bad-topic",
        lambda e: e.admin.query_by_uniq_key("a b", "u"),
        InvalidTopicError,
        "characters outside",
    ),
    Case("dlq-group-bad", lambda e: e.admin.dlq_messages("a b"), InvalidArgumentError, "group"),
    Case("dlq-max-0", lambda e: e.admin.dlq_messages("g", 0), InvalidArgumentError, "max_num"),
    Case(
        "dlq-start-negative",
        lambda e: e.admin.dlq_messages("g", start_offset=-1),
        InvalidArgumentError,
        "start_offset",
    ),
    Case("resend-dlq-empty-id", lambda e: e.admin.resend_dlq("g", ""), InvalidArgumentError, "msg_id"),
    Case(
        "resend-dlq-no-dlq",
        lambda e: e.admin.resend_dlq("g", "X" * 32),
        InvalidArgumentError,
        "no dead-letter queue",
    ),
    Case(
        "reset-by-time-group",
        lambda e: e.admin.reset_offset_by_time("", TOPIC, 0),
        InvalidArgumentError,
        "group",
    ),
    Case(
        "reset-by-time-unknown",
        lambda e: e.admin.reset_offset_by_time(GROUP, "Nope", 0),
        TopicNotFoundError,
        "does not exist",
    ),
    Case(
        "reset-by-time-negative",
        lambda e: e.admin.reset_offset_by_time(GROUP, TOPIC, -1),
        InvalidArgumentError,
        ">= 0",
    ),
    Case(
        "reset-by-time-str",
        lambda e: e.admin.reset_offset_by_time(GROUP, TOPIC, "now"),
        InvalidArgumentError,
        "epoch-millisecond",
    ),
    Case(
        "reset-offset-bad-queue",
        lambda e: e.admin.reset_offset(GROUP, TOPIC, 4, 0),
        InvalidArgumentError,
        "out of range",
    ),
    Case(
        "reset-offset-str",
        lambda e: e.admin.reset_offset(GROUP, TOPIC, 0, "1"),
        InvalidArgumentError,
        "must be an int",
    ),
    Case(
        "reset-offset-past-max",
        lambda e: e.admin.reset_offset(GROUP, TOPIC, 0, 999),
        OffsetOutOfRangeError,
        "outside",
    ),
    Case(
        "reset-offset-negative",
        lambda e: e.admin.reset_offset(GROUP, TOPIC, 0, -1),
        OffsetOutOfRangeError,
        "outside",
    ),
    Case(
        "reset-offset-overflow",
        lambda e: e.admin.reset_offset(GROUP, TOPIC, 0, 2**64),
        OffsetOutOfRangeError,
        "outside",
    ),
    Case("consumer-lag-group", lambda e: e.admin.consumer_lag("a b"), InvalidArgumentError, "group"),
    Case("update-topic-shrink", lambda e: e.admin.update_topic(TOPIC, queues=2), TopicShrinkError, "shrink"),
    Case(
        "update-topic-overflow",
        lambda e: e.admin.update_topic(TOPIC, queues=5000),
        InvalidArgumentError,
        "1..1024",
    ),
    Case(
        "update-topic-unknown",
        lambda e: e.admin.update_topic("Nope", queues=8),
        TopicNotFoundError,
        "does not exist",
    ),
    Case(
        "update-topic-system", lambda e: e.admin.update_topic("%DLQ%g", queues=8), InvalidTopicError, "system"
    ),
    Case("update-topic-perm", lambda e: e.admin.update_topic(TOPIC, perm=1), InvalidArgumentError, "perm"),
    Case(
        "delete-topic-unknown", lambda e: e.admin.delete_topic("Nope"), TopicNotFoundError, "does not exist"
    ),
    Case(
        "delete-topic-system",
        lambda e: e.admin.delete_topic("SCHEDULE_TOPIC_XXXX"),
        InvalidTopicError,
        "system",
    ),
    Case("group-progress-bad", lambda e: e.admin.group_progress("a b"), InvalidArgumentError, "group"),
    Case(
        "group-progress-topic",
        lambda e: e.admin.group_progress(GROUP, "Nope"),
        TopicNotFoundError,
        "not exist",
    ),
    Case("trace-empty", lambda e: e.admin.trace(""), InvalidArgumentError, "msg_id"),
    Case("trace-unknown", lambda e: e.admin.trace("0" * 32), MessageNotFoundError, "no message"),
    Case("find-message-space", lambda e: e.admin.find_message("a b"), InvalidArgumentError, "whitespace"),
    Case("query-time-reversed", lambda e: e.admin.query_by_time(TOPIC, 5, 1), InvalidArgumentError, "after"),
    Case(
        "query-time-max-0", lambda e: e.admin.query_by_time(TOPIC, 0, 1, 0), InvalidArgumentError, "max_num"
    ),
]


def open_at(path: object, **kwargs: Any) -> Call:
    return lambda e: Store.open(path if not isinstance(path, str) else e.tmp / path, **kwargs)


def a_file(e: Env) -> Path:
    path = e.tmp / "plain-file"
    path.write_text("not a store")
    return path


def foreign_table(e: Env) -> Path:
    """A directory whose ``commit_log`` is a Delta table of another schema."""
    root = e.tmp / "foreign"
    if not (root / "commit_log").exists():
        import pyarrow as pa

        write_deltalake(str(root / "commit_log"), pa.table({"x": [1]}))
    return root


def load_toml(e: Env, name: str, text: str) -> EngineConfig:
    """``load_config`` of a file ``name`` holding ``text``."""
    path = e.tmp / name
    path.write_text(text)
    return load_config(path)


STORE_CONFIG_CASES = [
    Case(
        "store-open-path-is-file",
        lambda e: Store.open(a_file(e)),
        StoreError,
        "cannot create store directory",
    ),
    Case(
        "store-open-under-file",
        lambda e: Store.open(a_file(e) / "sub"),
        StoreError,
        "cannot create store directory",
    ),
    Case("store-open-path-int", lambda e: Store.open(5), StoreError, "path"),
    Case("store-open-path-empty", lambda e: Store.open(""), StoreError, "non-empty"),
    Case(
        "store-open-foreign-table",
        lambda e: Store.open(foreign_table(e)),
        StoreError,
        "not a commit_log table",
    ),
    Case(
        "store-open-config-not-config",
        lambda e: Store.open(e.tmp / "x", config={"store": "y"}),
        ConfigError,
        "EngineConfig",
    ),
    Case(
        "store-open-storage-options-list",
        lambda e: Store.open(e.tmp / "x", storage_options=["a"]),
        ConfigError,
        "storage_options",
    ),
    Case("config-queues-0", lambda e: EngineConfig(default_queues=0), ConfigError, "default_queues"),
    Case("config-queues-str", lambda e: EngineConfig(default_queues="4"), ConfigError, "integer"),
    Case("config-linger-negative", lambda e: EngineConfig(producer_linger_ms=-1), ConfigError, ">= 0"),
    Case("config-store-int", lambda e: EngineConfig(store=5), ConfigError, "string"),
    Case("config-log-level-unknown", lambda e: EngineConfig(log_level="LOUD"), ConfigError, "log_level"),
    Case("load-config-unknown-key", lambda e: load_config(queues=4), ConfigError, "unknown config key"),
    Case("load-config-bad-type", lambda e: load_config(max_commit_attempts="many"), ConfigError, "integer"),
    Case(
        "load-config-missing-file",
        lambda e: load_config(e.tmp / "absent.toml"),
        ConfigError,
        "does not exist",
    ),
    Case("load-config-path-int", lambda e: load_config(5), ConfigError, "path"),
    Case(
        "load-config-bad-toml",
        lambda e: load_toml(e, "bad.toml", "queues = = 1"),
        ConfigError,
        "not valid TOML",
    ),
    Case(
        "load-config-unknown-toml-key",
        lambda e: load_toml(e, "k.toml", "[engine]\nqueues = 1"),
        ConfigError,
        "unknown key",
    ),
    Case(
        "load-config-toml-bad-value",
        lambda e: load_toml(e, "v.toml", "[engine]\ndefault_queues = 'x'"),
        ConfigError,
        "integer",
    ),
    Case(
        "load-config-toml-engine-not-table",
        lambda e: load_toml(e, "t.toml", "engine = 5"),
        ConfigError,
        "table",
    ),
]

SPARK_OPTION_CASES = [
    Case(
        "mq-read-no-topic",
        lambda e: ReadOptions.parse({"store": str(e.root)}, streaming=False),
        InvalidArgumentError,
        "topic",
    ),
    Case(
        "mq-read-no-store",
        lambda e: ReadOptions.parse({"topic": TOPIC}, streaming=False),
        InvalidArgumentError,
        "store",
    ),
    Case(
        "mq-read-bad-topic",
        lambda e: ReadOptions.parse({"store": str(e.root), "topic": "a b"}, streaming=False),
        InvalidTopicError,
        "characters outside",
    ),
    Case(
        "mq-read-bad-group",
        lambda e: ReadOptions.parse({"store": str(e.root), "topic": TOPIC, "group": "a b"}, streaming=True),
        InvalidArgumentError,
        "group",
    ),
    Case(
        "mq-read-stream-only-option",
        lambda e: ReadOptions.parse({"store": str(e.root), "topic": TOPIC, "group": "g"}, streaming=False),
        InvalidArgumentError,
        "not for batch",
    ),
    Case(
        "mq-read-bad-offsets",
        lambda e: ReadOptions.parse(
            {"store": str(e.root), "topic": TOPIC, "startingOffsets": "middle"}, streaming=False
        ),
        InvalidArgumentError,
        "startingOffsets",
    ),
    Case(
        "mq-read-negative-offset",
        lambda e: ReadOptions.parse(
            {"store": str(e.root), "topic": TOPIC, "startingOffsets": '{"0": -1}'}, streaming=False
        ),
        InvalidArgumentError,
        "offset",
    ),
    Case(
        "mq-read-end-before-start",
        lambda e: ReadOptions.parse(
            {"store": str(e.root), "topic": TOPIC, "startTime": "10", "endTime": "5"}, streaming=False
        ),
        InvalidArgumentError,
        "before",
    ),
    Case(
        "mq-read-trigger-0",
        lambda e: ReadOptions.parse(
            {"store": str(e.root), "topic": TOPIC, "maxMessagesPerTrigger": "0"}, streaming=True
        ),
        InvalidArgumentError,
        ">= 1",
    ),
    Case(
        "mq-read-storage-options",
        lambda e: ReadOptions.parse(
            {"store": str(e.root), "topic": TOPIC, "storageOptions": "{"}, streaming=False
        ),
        InvalidArgumentError,
        "not JSON",
    ),
    Case(
        "mq-write-stream-no-sink",
        lambda e: WriteOptions.parse({"store": str(e.root)}, streaming=True),
        InvalidArgumentError,
        "sinkId",
    ),
    Case(
        "mq-write-bad-sink",
        lambda e: WriteOptions.parse({"store": str(e.root), "sinkId": "a b"}, streaming=False),
        InvalidArgumentError,
        "sinkId",
    ),
    Case(
        "mq-write-batch-without-sink",
        lambda e: WriteOptions.parse({"store": str(e.root), "batchId": "1"}, streaming=False),
        InvalidArgumentError,
        "needs sinkId",
    ),
    Case(
        "mq-write-batch-id-str",
        lambda e: WriteOptions.parse(
            {"store": str(e.root), "sinkId": "s", "batchId": "one"}, streaming=False
        ),
        InvalidArgumentError,
        "integer",
    ),
]

ALL_CASES = [
    *MESSAGE_CASES,
    *PRODUCER_CASES,
    *PULL_CASES,
    *PUSH_CASES,
    *SIMPLE_CASES,
    *TX_CASES,
    *ADMIN_CASES,
    *STORE_CONFIG_CASES,
    *SPARK_OPTION_CASES,
]

_outcomes: dict[str, str] = {}  # case id -> "typed" or what went wrong


@pytest.mark.parametrize("case", ALL_CASES, ids=[c.id for c in ALL_CASES])
def test_bad_input_raises_its_typed_error_and_writes_no_version(env: Env, case: Case) -> None:
    before = versions(env.store)
    _outcomes[case.id] = "no error"
    with pytest.raises(MQError) as caught:
        try:
            case.call(env)
        except MQError:
            raise
        except Exception as exc:
            _outcomes[case.id] = f"untyped {type(exc).__name__}"
            raise
    _outcomes[case.id] = f"wrong type {type(caught.value).__name__}"
    assert type(caught.value) is case.error, f"{type(caught.value).__name__}: {caught.value}"
    _outcomes[case.id] = "vague message"
    assert case.says.lower() in str(caught.value).lower(), str(caught.value)
    _outcomes[case.id] = "wrote a version"
    assert versions(env.store) == before
    _outcomes[case.id] = "typed"


# ----------------------------------------------------------------------------- the command line
CLI_CASES = [
    ("cli-unknown-command", ["frobnicate"], "invalid choice"),
    ("cli-no-command", [], "required"),
    ("cli-send-unknown-topic", ["send", "Nope", "hi"], "does not exist"),
    ("cli-send-bad-topic", ["send", "a b", "hi"], "characters outside"),
    ("cli-send-empty-body", ["send", TOPIC, ""], "body is empty"),
    ("cli-send-delay-negative", ["send", TOPIC, "hi", "--delay-level", "-1"], "must be >= 0"),
    ("cli-send-queue-negative", ["send", TOPIC, "hi", "--queue-id", "-1"], "queue-id"),
    ("cli-send-queue-out-of-range", ["send", TOPIC, "hi", "--queue-id", "9"], "out of range"),
    ("cli-send-property-no-equals", ["send", TOPIC, "hi", "--property", "novalue"], "key=value"),
    ("cli-send-property-reserved", ["send", TOPIC, "hi", "--property", "DELAY=1"], "reserved"),
    ("cli-send-key-with-tags-separator", ["send", TOPIC, "hi", "--tags", "A||B"], "'||'"),
    ("cli-send-system-topic", ["send", "%DLQ%g", "hi"], "system topic"),
    ("cli-pull-offset-not-int", ["pull", TOPIC, "--queue-id", "0", "--offset", "abc"], "invalid int"),
    ("cli-pull-missing-offset", ["pull", TOPIC, "--queue-id", "0"], "--offset"),
    ("cli-pull-unknown-topic", ["pull", "Nope", "--queue-id", "0", "--offset", "0"], "does not exist"),
    ("cli-pull-max-0", ["pull", TOPIC, "--queue-id", "0", "--offset", "0", "--max", "0"], "--max"),
    (
        "cli-pull-bad-expression",
        ["pull", TOPIC, "--queue-id", "0", "--offset", "0", "--expression", "||"],
        "empty tag",
    ),
    ("cli-pull-bad-group", ["pull", TOPIC, "--queue-id", "0", "--offset", "0", "--group", "a b"], "group"),
    ("cli-topic-create-bad-name", ["topic", "create", "a/b"], "characters outside"),
    ("cli-topic-create-reserved", ["topic", "create", "SCHEDULE_TOPIC_XXXX"], "reserved"),
    ("cli-topic-create-queues-0", ["topic", "create", "N", "--queues", "0"], "--queues"),
    ("cli-topic-create-queues-overflow", ["topic", "create", "N", "--queues", "5000"], "1..1024"),
    ("cli-topic-create-exists", ["topic", "create", TOPIC, "--queues", "2"], "exists"),
    ("cli-topic-create-type", ["topic", "create", "N", "--type", "ODD"], "invalid choice"),
    ("cli-topic-stats-unknown", ["topic", "stats", "Nope"], "does not exist"),
    ("cli-lag-bad-group", ["lag", "--group", "a b"], "group"),
    ("cli-dispatch-no-spark-without-once", ["dispatch", "--no-spark"], "--once"),
    ("cli-topic-update-shrink", ["topic", "update", TOPIC, "--queues", "1"], "shrink"),
    ("cli-topic-update-perm", ["topic", "update", TOPIC, "--perm", "all"], "invalid choice"),
    ("cli-topic-delete-system", ["topic", "delete", "%DLQ%g"], "system"),
    ("cli-group-progress-bad", ["group", "progress", "a b"], "group"),
    ("cli-group-reset-neither", ["group", "reset", GROUP, TOPIC], "--timestamp"),
    ("cli-group-reset-bad-time", ["group", "reset", GROUP, TOPIC, "--timestamp", "soon"], "not a time"),
    ("cli-message-view-unknown", ["message", "view", "0" * 32], "no message"),
    ("cli-message-trace-space", ["message", "trace", "a b"], "whitespace"),
    ("cli-message-query-reversed", ["message", "query", TOPIC, "--begin", "5", "--end", "1"], "after"),
    ("cli-dlq-resend-neither", ["dlq", "resend", GROUP], "--all"),
    ("cli-dlq-list-bad-group", ["dlq", "list", "a b"], "group"),
    ("cli-sql-without-query", ["sql"], "query"),
    ("cli-dashboard-bad-port", ["dashboard", "--port", "-1"], "--port"),
]


@pytest.mark.parametrize(("argv", "says"), [c[1:] for c in CLI_CASES], ids=[c[0] for c in CLI_CASES])
def test_cli_bad_arguments_give_one_line_and_exit_2(
    env: Env, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, argv: list[str], says: str
) -> None:
    monkeypatch.delenv("MQ_DEBUG", raising=False)
    case_id = "cli:" + " ".join(argv)
    _outcomes[case_id] = "failed"
    before = versions(env.store)
    needs_store = argv and argv[0] in ("send", "pull", "topic", "lag", "dispatch")
    code = mq_main([*argv, "--store", str(env.root)] if needs_store and len(argv) > 1 else argv)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("mq: error: "), err
    assert "Traceback" not in err
    assert says.lower() in lines[0].lower(), lines[0]
    assert versions(env.store) == before
    _outcomes[case_id] = "typed"


def test_cli_store_path_that_is_a_file_is_one_line(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    code = mq_main(["topic", "list", "--store", str(a_file(env))])
    err = capsys.readouterr().err
    _outcomes["cli:store-is-a-file"] = "typed" if code == 2 and err.count("\n") == 1 else "failed"
    assert code == 2 and err.startswith("mq: error: cannot create store directory"), err


# ----------------------------------------------------------------------------- the record
@pytest.fixture(scope="module", autouse=True)
def _record_matrix(env: Env) -> Iterator[None]:
    """After every case of this module: acknowledged messages still stored once, offsets dense; one
    row in FAULTS.md with the count of cases and of those that were not typed cleanly."""
    yield
    figures = check(env.store, env.log.history, topics=[TOPIC])
    typed = sum(1 for v in _outcomes.values() if v == "typed")
    failures = sorted(f"{k}: {v}" for k, v in _outcomes.items() if v != "typed")
    record(
        "bad input matrix (every public entry point)",
        figures,
        cases=len(_outcomes),
        typed_no_version=typed,
        not_typed_or_wrote=len(failures),
    )
    if failures:
        figures.problems.extend(failures)
    figures.assert_ok()
