"""Argument checks of the maintenance steps (compaction, retention, checkpoints, vacuum)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from engine.errors import InvalidArgumentError
from engine.store import schemas

HOUR_MS = 3_600_000


def table_names(table: str | Sequence[str] | None) -> list[str]:
    """The tables named (every table for None); raises :class:`InvalidArgumentError` for unknown ones."""
    if table is None:
        return list(schemas.SCHEMAS)
    names = [table] if isinstance(table, str) else list(table)
    for name in names:
        if name not in schemas.SCHEMAS:
            raise InvalidArgumentError(
                f"unknown table {name!r}; tables: {', '.join(schemas.SCHEMAS)}", table=name
            )
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
