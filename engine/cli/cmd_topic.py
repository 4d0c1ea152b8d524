"""``mq topic create|list|stats|update|delete``: topics and their queues (mqadmin's updateTopic,
topicList, topicStatus, deleteTopic)."""

from __future__ import annotations

import argparse
from typing import Any

from engine.cli import render
from engine.cli.common import EXIT_OK, Output, Parser, int_at_least, open_store
from engine.client.admin import Admin

TOPIC_TYPES = ["NORMAL", "FIFO", "DELAY", "TRANSACTION"]
PERMS = {"read": 4, "write": 2, "read+write": 6}


def _create(args: argparse.Namespace, out: Output) -> int:
    admin = Admin(open_store(args))
    if len(args.names) == 1:
        config = admin.create_topic(args.names[0], args.queues, type=args.type)
        out.emit(config, f"topic [bold]{config.name}[/bold]: {config.queues} queue(s), type {config.type}")
        return EXIT_OK
    configs = admin.create_topics(args.names, args.queues, type=args.type)  # one commit for all
    out.emit(configs, render.topics_table(configs))
    return EXIT_OK


def _list(args: argparse.Namespace, out: Output) -> int:
    topics = Admin(open_store(args)).topics(include_system=args.all)
    out.emit(topics, render.topics_table(topics))
    return EXIT_OK


def _stats(args: argparse.Namespace, out: Output) -> int:
    stats = Admin(open_store(args)).topic_stats(args.name)
    out.emit(stats, render.stats_table(args.name, stats))
    return EXIT_OK


def _update(args: argparse.Namespace, out: Output) -> int:
    admin = Admin(open_store(args))
    perm = None if args.perm is None else PERMS[args.perm]
    config = admin.update_topic(args.name, queues=args.queues, perm=perm)
    out.emit(config, f"topic [bold]{config.name}[/bold]: {config.queues} queue(s), perm {config.perm}")
    return EXIT_OK


def _delete(args: argparse.Namespace, out: Output) -> int:
    config = Admin(open_store(args)).delete_topic(args.name, force=args.force)
    data: dict[str, Any] = {"deleted": config.name, "queues": config.queues}
    out.emit(data, f"topic {config.name} deleted (its rows age out with retention)")
    return EXIT_OK


def register(commands: Any, common: argparse.ArgumentParser) -> None:
    """Add ``topic`` and its actions to ``commands`` (an argparse subparsers object)."""
    topic = commands.add_parser("topic", help="create, list, inspect, expand and delete topics")
    actions = topic.add_subparsers(dest="topic_command", required=True, metavar="ACTION", parser_class=Parser)
    create = actions.add_parser(
        "create", parents=[common], help="create topics (idempotent; several names: one commit)"
    )
    create.add_argument("names", nargs="+", metavar="name")
    create.add_argument("--queues", type=int_at_least(1), default=None, help="queues (default 4)")
    create.add_argument("--type", default="NORMAL", choices=TOPIC_TYPES)
    create.set_defaults(func=_create)
    listing = actions.add_parser("list", parents=[common], help="list topics")
    listing.add_argument("--all", action="store_true", help="include system topics (retry, DLQ, schedule)")
    listing.set_defaults(func=_list)
    stats = actions.add_parser("stats", parents=[common], help="per-queue offsets of a topic")
    stats.add_argument("name")
    stats.set_defaults(func=_stats)
    update = actions.add_parser("update", parents=[common], help="add queues to a topic, or change its perm")
    update.add_argument("name")
    update.add_argument(
        "--queues", type=int_at_least(1), default=None, help="the new queue count (only grows)"
    )
    update.add_argument("--perm", choices=list(PERMS), default=None, help="read, write or read+write")
    update.set_defaults(func=_update)
    delete = actions.add_parser("delete", parents=[common], help="remove a topic from routing")
    delete.add_argument("name")
    delete.add_argument("--force", action="store_true", help="delete even while groups consume it")
    delete.set_defaults(func=_delete)
