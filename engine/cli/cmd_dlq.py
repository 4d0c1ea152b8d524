"""``mq dlq list|resend``: a group's dead letters, and sending them back to their topics."""

from __future__ import annotations

import argparse
from typing import Any

from engine.cli import render
from engine.cli.common import EXIT_OK, Output, Parser, int_at_least, open_store
from engine.client.admin import Admin
from engine.errors import CliError
from engine.model import MessageExt, SendResult

PAGE = 1024


def _all_dead_letters(admin: Admin, group: str) -> list[MessageExt]:
    found: list[MessageExt] = []
    while True:
        start = found[-1].queue_offset + 1 if found else None
        page = admin.dlq_messages(group, PAGE, start_offset=start)
        found += page
        if len(page) < PAGE:
            return found


def _list(args: argparse.Namespace, out: Output) -> int:
    messages = Admin(open_store(args)).dlq_messages(args.group, args.max, start_offset=args.start_offset)
    title = f"{len(messages)} dead letter(s) of group {args.group}"
    out.emit(messages, render.messages_table(messages, title=title))
    return EXIT_OK


def _resend(args: argparse.Namespace, out: Output) -> int:
    if (args.id is None) == (not args.all):
        raise CliError("give one dead letter's id, or --all")
    admin = Admin(open_store(args))
    if args.all:
        with out.progress(f"reading the dead letters of {args.group}"):
            # By store id: the same message dead-lettered twice (resent, failed again) is two letters.
            targets = [m.offset_msg_id for m in _all_dead_letters(admin, args.group)]
    else:
        targets = [args.id]
    results: list[tuple[str, SendResult]] = []
    with out.bar() as bar:
        task = bar.add_task(f"resending {args.group}'s dead letters", total=len(targets))
        for msg_id in targets:
            results.append((msg_id, admin.resend_dlq(args.group, msg_id)))
            bar.advance(task)
    rows = [(dead, sent.topic, sent.queue_id, sent.msg_id, sent.offset_msg_id) for dead, sent in results]
    table = render.rows_table(
        ["dead letter", "topic", "queue", "msg id (kept)", "new offset msg id"],
        rows,
        title=f"{len(rows)} resent",
    )
    out.emit([{"dlq_msg_id": dead, "sent": sent} for dead, sent in results], table)
    return EXIT_OK


def register(commands: Any, common: argparse.ArgumentParser) -> None:
    """Add ``dlq`` (list, resend) to ``commands``."""
    dlq = commands.add_parser("dlq", help="dead letters of a group: list, resend")
    actions = dlq.add_subparsers(dest="dlq_command", required=True, metavar="ACTION", parser_class=Parser)
    listing = actions.add_parser("list", parents=[common], help="the group's dead letters, oldest first")
    listing.add_argument("group")
    listing.add_argument(
        "--max", type=int_at_least(1), default=100, help="most shown (default 100, at most 1024)"
    )
    listing.add_argument("--start-offset", type=int_at_least(0), default=None, help="first DLQ offset shown")
    listing.set_defaults(func=_list)
    resend = actions.add_parser("resend", parents=[common], help="send dead letters back to their topic")
    resend.add_argument("group")
    resend.add_argument("id", nargs="?", default=None, help="the dead letter's msg id or offset msg id")
    resend.add_argument("--all", action="store_true", help="every dead letter of the group")
    resend.set_defaults(func=_resend)
