"""The ``group_configs`` table: settings of consumer groups, append-only (the newest row of a group wins).

A group with no row has the defaults (:class:`GroupConfig`). Today the one setting is ``fifo``:
RocketMQ's ``consumeMessageOrderly``, RocketMQ 5's FIFO consume type; a ``SimpleConsumer`` of a
FIFO group receives each queue in order (:mod:`engine.client.simple.leases`).
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.dataset as ds

from engine.errors import InvalidArgumentError
from engine.protocol.names import validate_group_name
from engine.store import schemas
from engine.store.store import Store, now_ms, sql_literal


@dataclass(frozen=True)
class GroupConfig:
    """A consumer group's settings (the defaults for a group never configured)."""

    group: str
    fifo: bool = False
    ts_ms: int = 0  # when they were set (0: never)


def record_group_config(store: Store, group: str, *, fifo: bool) -> GroupConfig:
    """Set ``group``'s settings (one append).

    Raises:
        InvalidArgumentError: a bad group name or a ``fifo`` that is not a bool.
    """
    group = validate_group_name(group)
    if not isinstance(fifo, bool):
        raise InvalidArgumentError(f"fifo must be a bool, got {fifo!r}", group=group)
    config = GroupConfig(group, fifo, now_ms())
    row = {"group": group, "fifo": fifo, "ts_ms": config.ts_ms}
    store.append(schemas.GROUP_CONFIGS, pa.Table.from_pylist([row], schema=schemas.GROUP_CONFIGS_SCHEMA))
    return config


def group_configs(store: Store, group: str | None = None) -> dict[str, GroupConfig]:
    """The settings of every configured group (or of ``group`` only), newest row per group (on
    equal times, the later row)."""
    if group is None:
        table = store.read(schemas.GROUP_CONFIGS)
    else:
        table = store.read(
            schemas.GROUP_CONFIGS,
            predicate=f"group = {sql_literal(group)}",
            filter=ds.field("group") == group,
        )
    out: dict[str, GroupConfig] = {}
    for row in table.to_pylist():
        seen = out.get(row["group"])
        if seen is None or row["ts_ms"] >= seen.ts_ms:
            out[row["group"]] = GroupConfig(row["group"], bool(row["fifo"]), int(row["ts_ms"]))
    return out


def group_config(store: Store, group: str) -> GroupConfig:
    """``group``'s settings (the defaults when it was never configured)."""
    return group_configs(store, group).get(group, GroupConfig(group))
