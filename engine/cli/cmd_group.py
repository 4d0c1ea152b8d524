"""``mq group list|progress|reset|config`` and ``mq lag``: consumer groups (mqadmin's consumerProgress,
resetOffsetByTime, updateSubGroup's consumeMessageOrderly as ``config --fifo``)."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from engine.cli import render
from engine.cli.common import EXIT_OK, Output, Parser, int_at_least, open_store, time_arg
from engine.client.admin import Admin
from engine.client.admin_groups import QueueProgress
from engine.client.admin_offsets import QueueLag
from engine.errors import CliError


def _list(args: argparse.Namespace, out: Output) -> int:
    groups = Admin(open_store(args)).groups()
    rows = [(g.group, g.members, " ".join(g.topics), g.lag, "yes" if g.has_dlq else "") for g in groups]
    table = render.rows_table(
        ["group", "members", "topics", "lag", "dlq"], rows, title=f"{len(groups)} group(s)"
    )
    out.emit(groups, table)
    return EXIT_OK


def _progress(args: argparse.Namespace, out: Output) -> int:
    rows = Admin(open_store(args)).group_progress(args.group, args.topic)
    if not rows:
        out.emit(rows, f"group {args.group} has no committed offsets")
        return EXIT_OK
    columns = [f.name for f in dataclasses.fields(QueueProgress) if f.name != "group"]
    cells = [
        tuple(render.format_ts(getattr(r, c)) if c.endswith("_ts_ms") else getattr(r, c) for c in columns)
        for r in rows
    ]
    title = f"{args.group}: {sum(r.lag for r in rows)} message(s) behind"
    out.emit(rows, render.rows_table(columns, cells, title=title))
    return EXIT_OK


def _reset(args: argparse.Namespace, out: Output) -> int:
    by_time = args.timestamp is not None
    by_offset = args.queue_id is not None or args.offset is not None
    if by_time == by_offset or (by_offset and (args.queue_id is None or args.offset is None)):
        raise CliError("give either --timestamp T, or --queue-id Q and --offset N")
    admin = Admin(open_store(args))
    if by_time:
        offsets = admin.reset_offset_by_time(args.group, args.topic, args.timestamp)
    else:
        admin.reset_offset(args.group, args.topic, args.queue_id, args.offset)
        offsets = {args.queue_id: args.offset}
    data: dict[str, Any] = {"group": args.group, "topic": args.topic, "offsets": offsets}
    table = render.rows_table(["queue", "new offset"], sorted(offsets.items()), title=f"{args.group} reset")
    out.emit(data, table)
    return EXIT_OK


def _config(args: argparse.Namespace, out: Output) -> int:
    admin = Admin(open_store(args))
    if args.fifo is None:
        config = admin.group_config(args.group)
    else:
        config = admin.update_group(args.group, fifo=args.fifo)
    title = f"{config.group}: {'FIFO' if config.fifo else 'not FIFO'}"
    out.emit(config, render.rows_table(["group", "fifo"], [(config.group, config.fifo)], title=title))
    return EXIT_OK


def _lag(args: argparse.Namespace, out: Output) -> int:
    rows = Admin(open_store(args)).consumer_lag(args.group)
    if not rows:
        out.emit(rows, "no committed offsets" + (f" for group {args.group}" if args.group else ""))
        return EXIT_OK
    columns = [f.name for f in dataclasses.fields(QueueLag)]
    table = [tuple(getattr(r, c) for c in columns) for r in rows]
    title = f"lag: {sum(r.lag for r in rows)} message(s) behind"
    out.emit(rows, render.rows_table(columns, table, title=title))
    return EXIT_OK


def register(commands: Any, common: argparse.ArgumentParser) -> None:
    """Add ``group`` (list, progress, reset, config) and ``lag`` to ``commands``."""
    group = commands.add_parser("group", help="consumer groups: list, progress, reset offsets, config")
    actions = group.add_subparsers(dest="group_command", required=True, metavar="ACTION", parser_class=Parser)
    listing = actions.add_parser("list", parents=[common], help="every group the logs know of")
    listing.set_defaults(func=_list)
    progress = actions.add_parser(
        "progress", parents=[common], help="per queue: max, committed, lag, last consumed time"
    )
    progress.add_argument("group")
    progress.add_argument("--topic", default=None, help="only this topic")
    progress.set_defaults(func=_progress)
    reset = actions.add_parser(
        "reset", parents=[common], help="move a group's offsets (by time, or one queue)"
    )
    reset.add_argument("group")
    reset.add_argument("topic")
    reset.add_argument("--timestamp", type=time_arg, default=None, help="ms, now, now-1h or ISO 8601")
    reset.add_argument("--queue-id", type=int_at_least(0), default=None)
    reset.add_argument("--offset", type=int_at_least(0), default=None)
    reset.set_defaults(func=_reset)

    config = actions.add_parser(
        "config", parents=[common], help="show or set a group's settings (--fifo: a FIFO group)"
    )
    config.add_argument("group")
    config.add_argument(
        "--fifo",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="receive each queue in order, the next only after the previous is acked (RocketMQ 5 FIFO)",
    )
    config.set_defaults(func=_config)

    lag = commands.add_parser("lag", parents=[common], help="how far consumer groups are behind, per queue")
    lag.add_argument("--group", default=None, help="only this consumer group")
    lag.set_defaults(func=_lag)
