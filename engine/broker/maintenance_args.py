"""Argument checks of the maintenance steps (compaction, retention, checkpoints, vacuum)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from engine.errors import InvalidArgumentError
from engine.store.store import Store

HOUR_MS = 3_600_000


def table_names(store: Store, table: str | Sequence[str] | None) -> list[str]:
    """The tables named (every table of ``store``, each commit-log shard included, for None);
    raises :class:`InvalidArgumentError` for names that are no table of ``store``."""
    known = store.tables()
    if table is None:
        return list(known)
    names = [table] if isinstance(table, str) else list(table)
    for name in names:
        if name not in known:
            raise InvalidArgumentError(f"unknown table {name!r}; tables: {', '.join(known)}", table=name)
    return names


def check_int(name: str, value: object, minimum: int) -> int:
    """``value`` if it is an int >= ``minimum``; raises :class:`InvalidArgumentError` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidArgumentError(f"{name} must be an int >= {minimum}, got {value!r}", **{name: value})
    return value


def check_hours(name: str, value: object) -> float:
    """``value`` as hours if it is a finite number >= 0; raises :class:`InvalidArgumentError` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
        raise InvalidArgumentError(f"{name} must be a number of hours >= 0, got {value!r}", **{name: value})
    return float(value)
