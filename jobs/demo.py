"""A short tour of lakemq in one Spark application: ``./spark-submit.sh jobs/demo.py [--store PATH]``.

Creates ``DemoTopic`` (4 queues), sends ten tagged messages, a batch and one message with delay
level 1 (1 s), then runs one pass of every broker job in this Spark application (``jobs/broker.py
--once``: dispatch, index, schedule, retry, pull_log, transaction_check, maintenance), pulls
``TagA`` messages from every queue from the demo group's committed offsets (committing the new
ones), the delayed message among them once the schedule job has re-put it, then counts the topic's
messages per queue and tag with SQL over the ``messages`` view. Safe to rerun on an existing store:
each run adds its messages and pulls what the group has not consumed yet.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from engine import Admin, Message, MQError, Producer, PullConsumer, PullStatus, Store
from engine.errors import StoreError
from engine.spark.jobs.broker_app import run_once
from engine.spark.jobs.runner import first_line

TOPIC = "DemoTopic"
QUEUES = 4
GROUP = "DemoConsumerGroup"
EXPRESSION = "TagA"
PROG = "jobs/demo.py"
DELAY_S = 1.2  # delay level 1 is 1 s; a little more so the pass surely finds it due

COUNT_SQL = f"""
SELECT queue_id, tags, count(*) AS messages
FROM messages
WHERE topic = '{TOPIC}'
GROUP BY queue_id, tags
ORDER BY queue_id, tags
"""


def produce(store: Store, console: Console) -> float:
    """Ten single sends alternating TagA/TagB (orders keyed by id), a batch of five, one delayed.

    Returns:
        When (``time.monotonic()``) the delayed message is due.
    """
    with Producer(store, "DemoProducerGroup") as producer:
        table = Table(title=f"sent to {TOPIC}", title_justify="left")
        for column in ("tags", "keys", "queue", "queue offset", "msg id"):
            table.add_column(column)
        for i in range(10):
            tag = "TagA" if i % 2 == 0 else "TagB"
            order = f"order-{i}"
            message = Message(TOPIC, f"Hello lakemq #{i}".encode(), tags=tag, keys=[order])
            # Messages of one order share a queue, so they are consumed in order.
            r = producer.send(message, sharding_key=order)
            table.add_row(tag, order, str(r.queue_id), str(r.queue_offset), r.msg_id)
        batch = [Message(TOPIC, f"batch item {i}".encode(), tags="TagA") for i in range(5)]
        results = producer.send_batch(batch)
        first, last = results[0], results[-1]
        table.add_row(
            "TagA", "-", str(first.queue_id), f"{first.queue_offset}..{last.queue_offset}", "(batch of 5)"
        )
        # Held in the schedule topic until due; the schedule job then re-puts it into DemoTopic.
        delayed = Message(TOPIC, b"delayed by level 1 (1s)", tags="TagA")
        r = producer.send(delayed, delay_level=1)
        # Due 1 s after its store time, which is before send returns: counted from here, a commit that
        # takes long on a busy machine cannot make the wait too short.
        due = time.monotonic() + DELAY_S
        table.add_row("TagA", "-", "(schedule)", "-", f"{r.msg_id} (delay level 1)")
    console.print(table)
    return due


def pull_new(store: Store, console: Console) -> int:
    """Pull what the demo group has not consumed, TagA only, and commit the new offsets."""
    consumer = PullConsumer(store, GROUP)
    table = Table(title=f"pulled by {GROUP} with expression {EXPRESSION!r}", title_justify="left")
    for column in ("queue", "offset", "tags", "keys", "body"):
        table.add_column(column)
    found = 0
    for qid in range(QUEUES):
        offset = consumer.committed_offset(TOPIC, qid) or 0
        while True:
            result = consumer.pull(TOPIC, qid, offset, 32, EXPRESSION)
            if result.status is PullStatus.OFFSET_ILLEGAL:
                offset = result.next_begin_offset  # RocketMQ's correction: move to where data is
                continue
            if result.status is PullStatus.NO_NEW_MSG:
                break
            for m in result.messages:
                table.add_row(
                    str(qid),
                    str(m.queue_offset),
                    m.tags or "",
                    " ".join(m.keys),
                    m.body.decode(errors="replace"),
                )
                found += 1
            offset = result.next_begin_offset
        consumer.commit_offset(TOPIC, qid, offset)
    console.print(table)
    return found


def count_by_sql(spark: Any, store: Store, console: Console) -> None:
    """Messages of the topic per queue and tag, from the ``messages`` view."""
    from engine.spark import register_views

    register_views(spark, store)
    frame = spark.sql(COUNT_SQL)
    table = Table(title="SQL: messages per queue and tag", title_justify="left")
    for column in frame.columns:
        table.add_column(column)
    for row in frame.collect():
        table.add_row(*(str(v) for v in row))
    console.print(table)


def run_demo(spark: Any, store: Store, console: Console) -> int:
    """The tour on an open store with a running SparkSession; returns how many messages it pulled.

    Raises:
        MQError: a store or client error; StoreError when a broker job fails.
    """
    config = Admin(store).create_topic(TOPIC, QUEUES)  # idempotent
    console.print(f"[bold]lakemq demo[/bold] on {store.root}: topic {config.name}, {config.queues} queues")
    due = produce(store, console)
    time.sleep(max(0.0, due - time.monotonic()))  # the schedule job's pass must find it due
    with console.status("running every broker job once (jobs/broker.py --once)"):
        run = run_once(spark, store, log=lambda line: console.print(line, markup=False))
    if not run.ok:
        failed = "; ".join(f"{job}: {why}" for job, why in run.failed.items())
        raise StoreError(f"broker job failed: {failed}")
    found = pull_new(store, console)
    console.print(f"{found} new {EXPRESSION} message(s) for {GROUP}")
    count_by_sql(spark, store, console)
    return found


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo; returns 0, 2 when the store is unusable, 1 when a step fails (one line on stderr)."""
    parser = argparse.ArgumentParser(prog=PROG, description="A short tour of lakemq.")
    parser.add_argument(
        "--store",
        default=os.environ.get("MQ_STORE") or "./mqdata",
        help="store directory or URI (default: $MQ_STORE or ./mqdata)",
    )
    args = parser.parse_args(argv)
    console = Console()
    try:
        store = Store.open(args.store)
    except MQError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    spark: Any = None
    try:
        from engine.spark import session

        with console.status("starting Spark"):
            spark = session(app_name="lakemq-demo")
        run_demo(spark, store, console)
        return 0
    except Exception as exc:  # an engine error, or Spark's: one line that names the cause
        print(f"{PROG}: error: {first_line(exc, limit=None)}", file=sys.stderr)
        return 1
    finally:
        if spark is not None:
            spark.stop()


if __name__ == "__main__":
    code = main()
    # End without interpreter finalization: pyarrow scan threads over delta-rs's filesystem can
    # abort a clean exit (delta-io/delta-rs#2184). Spark is stopped and every write committed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
