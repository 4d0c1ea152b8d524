"""``mq send``, ``mq pull`` and ``mq message view|query|trace`` (mqadmin's sendMessage,
queryMsgById, queryMsgByKey, queryMsgTraceById)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from engine.cli import render
from engine.cli.common import EXIT_OK, Output, Parser, int_at_least, open_store, parse_properties, time_arg
from engine.client.admin import Admin
from engine.client.producer import Producer
from engine.client.pull import PullConsumer
from engine.model import Message, PullStatus

CLI_PRODUCER_GROUP = "mq-cli"
CLI_CONSUMER_GROUP = "mq-cli"
DEFAULT_QUERY_HOURS = 72  # RocketMQ keeps 72 h of commit log by default; a key query looks that far


def _send(args: argparse.Namespace, out: Output) -> int:
    body = sys.stdin.buffer.read() if args.body == "-" else args.body.encode("utf-8")
    message = Message(
        args.topic,
        body,
        tags=args.tags,
        keys=tuple(args.keys or ()),
        properties=parse_properties(args.property),
    )
    with Producer(open_store(args), CLI_PRODUCER_GROUP) as producer:
        result = producer.send(
            message, queue_id=args.queue_id, sharding_key=args.sharding_key, delay_level=args.delay_level
        )
    out.emit(result, render.send_table(result))
    return EXIT_OK


def _pull(args: argparse.Namespace, out: Output) -> int:
    consumer = PullConsumer(open_store(args), args.group)
    waiting = f"waiting up to {args.suspend_ms} ms for messages on {args.topic}:{args.queue_id}"
    with out.progress(waiting if args.suspend_ms else "pulling"):
        result = consumer.pull(
            args.topic, args.queue_id, args.offset, args.max, args.expression, suspend_ms=args.suspend_ms
        )
    committed = None
    if args.commit and result.status in (PullStatus.FOUND, PullStatus.NO_MATCHED_MSG):
        consumer.commit_offset(args.topic, args.queue_id, result.next_begin_offset)
        committed = result.next_begin_offset
    shown: list[Any] = [render.pull_summary(result)]
    if result.messages:
        shown.append(render.messages_table(result.messages))
    if committed is not None:
        shown.append(f"committed offset {committed} for group {args.group}")
    out.emit({"result": result, "committed_offset": committed}, *shown)
    return EXIT_OK


def _view(args: argparse.Namespace, out: Output) -> int:
    message = Admin(open_store(args)).find_message(args.id)
    out.emit(message, render.message_view(message))
    return EXIT_OK


def _query(args: argparse.Namespace, out: Output) -> int:
    from engine.store.store import now_ms

    end = args.end if args.end is not None else now_ms()
    begin = args.begin if args.begin is not None else max(0, end - DEFAULT_QUERY_HOURS * 3_600_000)
    admin = Admin(open_store(args))
    if args.key is None:
        messages = admin.query_by_time(args.topic, begin, end, args.max)
        window = f"{render.format_ts(begin)} .. {render.format_ts(end)}"
        title = f"{len(messages)} message(s) of {args.topic} stored {window}"
    else:
        found = admin.query_by_key(args.topic, args.key, begin, end, args.max)
        messages = found
        title = f"{len(messages)} message(s) of {args.topic} with key {args.key}"
        if not found.complete:  # never a silent partial answer
            out.warn(
                f"warning: the key index is behind and {found.unread_versions} commit-log version(s) "
                "were not searched: older messages with this key may be missing (run the index job: "
                "mq broker --once, or jobs/index.py)"
            )
    out.emit(messages, render.messages_table(messages, title=title))
    return EXIT_OK


def _trace(args: argparse.Namespace, out: Output) -> int:
    with out.progress(f"reading the logs for {args.id}"):
        trace = Admin(open_store(args)).trace(args.id)
    out.emit(trace, render.trace_table(trace))
    return EXIT_OK


def register(commands: Any, common: argparse.ArgumentParser) -> None:
    """Add ``send``, ``pull`` and ``message`` (view, query, trace) to ``commands``."""
    send = commands.add_parser("send", parents=[common], help="send one message")
    send.add_argument("topic")
    send.add_argument("body", help="message body (UTF-8); '-' reads it from stdin")
    send.add_argument("--tags", default=None, help="the message's tag")
    send.add_argument("--keys", nargs="+", action="extend", default=None, metavar="K", help="business keys")
    send.add_argument("--queue-id", type=int_at_least(0), default=None, help="an explicit queue")
    send.add_argument("--sharding-key", default=None, help="choose the queue by hash of this key")
    send.add_argument("--property", nargs="+", action="extend", default=None, metavar="K=V")
    send.add_argument("--delay-level", type=int_at_least(0), default=0, help="1..18 (RocketMQ delay levels)")
    send.set_defaults(func=_send)

    pull = commands.add_parser("pull", parents=[common], help="pull messages from one queue")
    pull.add_argument("topic")
    pull.add_argument("--queue-id", type=int_at_least(0), required=True)
    pull.add_argument("--offset", type=int, required=True)
    pull.add_argument("--max", type=int_at_least(1), default=32, help="most messages (default 32)")
    pull.add_argument("--expression", default="*", help="tag expression, e.g. 'TagA || TagB' (default *)")
    pull.add_argument("--suspend-ms", type=int_at_least(0), default=0, help="long polling: wait this long")
    pull.add_argument(
        "--group", default=CLI_CONSUMER_GROUP, help=f"consumer group (default {CLI_CONSUMER_GROUP})"
    )
    pull.add_argument("--commit", action="store_true", help="commit the next offset for --group")
    pull.set_defaults(func=_pull)

    message = commands.add_parser("message", help="find messages: by id, by key; trace one")
    actions = message.add_subparsers(
        dest="message_command", required=True, metavar="ACTION", parser_class=Parser
    )
    view = actions.add_parser("view", parents=[common], help="one message by offset msg id or uniq key")
    view.add_argument("id", help="offset msg id or uniq key")
    view.set_defaults(func=_view)
    query = actions.add_parser("query", parents=[common], help="messages of a topic by key, or by store time")
    query.add_argument("topic")
    query.add_argument("--key", default=None, help="a business key (Message.keys); without it, by time")
    query.add_argument(
        "--begin", type=time_arg, default=None, help=f"from (default: {DEFAULT_QUERY_HOURS} h ago)"
    )
    query.add_argument("--end", type=time_arg, default=None, help="until (default: now)")
    query.add_argument("--max", type=int_at_least(1), default=32, help="most messages (default 32)")
    query.set_defaults(func=_query)
    trace = actions.add_parser("trace", parents=[common], help="the life of one message, from the logs")
    trace.add_argument("id", help="offset msg id or uniq key")
    trace.set_defaults(func=_trace)
