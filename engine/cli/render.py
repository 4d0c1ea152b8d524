"""How the ``mq`` command line shows results: rich tables, one per kind of answer.

Pure formatting: every function takes values and returns a renderable; nothing here does I/O.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Sequence
from typing import Any

from rich.table import Table
from rich.text import Text

from engine.client.trace import MessageTrace
from engine.model import MessageExt, PullResult, PullStatus, QueueStats, SendResult, TopicConfig

BODY_PREVIEW_CHARS = 60

_STATUS_STYLE = {
    PullStatus.FOUND: "bold green",
    PullStatus.NO_NEW_MSG: "yellow",
    PullStatus.NO_MATCHED_MSG: "yellow",
    PullStatus.OFFSET_ILLEGAL: "bold red",
}
_PERMS = {2: "write", 4: "read", 6: "read+write"}


def format_ts(ms: int | None) -> str:
    """An epoch-millisecond time as local ``YYYY-MM-DD HH:MM:SS.mmm`` (``-`` for none)."""
    if ms is None:
        return "-"
    return _dt.datetime.fromtimestamp(ms / 1000).isoformat(sep=" ", timespec="milliseconds")


def body_preview(body: bytes, limit: int = BODY_PREVIEW_CHARS) -> str:
    """A message body as text when it is UTF-8, else as hex; cut at ``limit`` characters."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        text = "0x" + body.hex()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def cell(value: Any) -> str:
    """One SQL result value as table text."""
    if value is None:
        return "NULL"
    if isinstance(value, bytes | bytearray):
        return body_preview(bytes(value))
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}={v}" for k, v in value.items()) + "}"
    return str(value)


def topics_table(topics: Sequence[TopicConfig]) -> Table:
    table = Table(title=f"{len(topics)} topic(s)", title_justify="left")
    table.add_column("topic", style="bold")
    table.add_column("queues", justify="right")
    table.add_column("type")
    table.add_column("perm")
    table.add_column("created")
    for t in topics:
        table.add_row(
            t.name, str(t.queues), t.type, _PERMS.get(t.perm, str(t.perm)), format_ts(t.created_ts_ms)
        )
    return table


def stats_table(topic: str, stats: Sequence[QueueStats]) -> Table:
    total = sum(s.max_offset - s.min_offset for s in stats)
    table = Table(title=f"{topic}: {total} dispatched message(s)", title_justify="left")
    table.add_column("queue", justify="right")
    table.add_column("min offset", justify="right")
    table.add_column("max offset", justify="right")
    table.add_column("messages", justify="right")
    table.add_column("last stored")
    for s in stats:
        table.add_row(
            str(s.queue_id),
            str(s.min_offset),
            str(s.max_offset),
            str(s.max_offset - s.min_offset),
            format_ts(s.last_store_ts_ms),
        )
    return table


def send_table(result: SendResult) -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="dim")
    grid.add_column()
    grid.add_row("status", Text(result.status.value, style="bold green"))
    grid.add_row("msg id", result.msg_id)
    grid.add_row("offset msg id", result.offset_msg_id)
    grid.add_row("topic", result.topic)
    grid.add_row("queue id", str(result.queue_id))
    grid.add_row("queue offset", str(result.queue_offset))
    grid.add_row("physical offset", str(result.physical_offset))
    return grid


def pull_summary(result: PullResult) -> Text:
    text = Text()
    text.append(result.status.value, style=_STATUS_STYLE[result.status])
    text.append(
        f"  next offset {result.next_begin_offset}  (queue min {result.min_offset}, max {result.max_offset})"
        f"  {len(result.messages)} message(s)"
    )
    return text


def messages_table(messages: Sequence[MessageExt], title: str | None = None) -> Table:
    """Messages, one a row; bodies, tags and keys are untrusted text, never markup."""
    table = Table(title=title, title_justify="left")
    table.add_column("offset", justify="right")
    table.add_column("tags")
    table.add_column("keys")
    table.add_column("body")
    table.add_column("msg id", no_wrap=True)
    table.add_column("stored")
    for m in messages:
        table.add_row(
            str(m.queue_offset),
            Text(m.tags or ""),
            Text(" ".join(m.keys)),
            Text(body_preview(m.body)),
            m.msg_id,
            format_ts(m.store_ts_ms),
        )
    return table


def message_view(m: MessageExt) -> Table:
    """One message, field by field (``mq message view``)."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="dim")
    grid.add_column()
    for name, value in (
        ("msg id", m.msg_id),
        ("offset msg id", m.offset_msg_id),
        ("topic", m.topic),
        ("queue id", str(m.queue_id)),
        ("queue offset", str(m.queue_offset)),
        ("physical offset", str(m.physical_offset)),
        ("tags", m.tags or ""),
        ("keys", " ".join(m.keys)),
        ("born", format_ts(m.born_ts_ms)),
        ("stored", format_ts(m.store_ts_ms)),
        ("reconsume times", str(m.reconsume_times)),
        ("size", str(m.size)),
    ):
        grid.add_row(name, Text(value))
    for key, value in sorted(m.properties.items()):
        grid.add_row(Text(f"property {key}"), Text(value))
    grid.add_row("body", Text(body_preview(m.body, limit=2000)))
    return grid


def trace_table(trace: MessageTrace) -> Table:
    """A message's life, one event a row (``mq message trace``)."""
    table = Table(
        title=f"msg id {trace.msg_id}: {len(trace.copies)} cop(ies), {len(trace.events)} event(s)",
        title_justify="left",
    )
    # Every copy has the message's id (the title's); the copy is told apart by its offset msg id.
    for name in ("time", "event", "topic", "queue", "offset", "offset msg id", "group", "consumer", "detail"):
        table.add_column(name)
    for e in trace.events:
        table.add_row(
            format_ts(e.ts_ms),
            e.kind.value,
            Text(e.topic),
            str(e.queue_id),
            str(e.queue_offset),
            e.offset_msg_id,
            Text(e.group or ""),
            Text(e.consumer_id or ""),
            Text(e.detail),
        )
    return table


def rows_table(columns: Sequence[str], rows: Sequence[Sequence[Any]], title: str | None = None) -> Table:
    table = Table(title=title, title_justify="left")
    for name in columns:
        table.add_column(name)
    for row in rows:
        table.add_row(*(Text(cell(v)) for v in row))
    return table
