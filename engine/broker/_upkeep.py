"""What the maintenance steps share: argument checks and the markers their commits carry forward."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from engine.errors import InvalidArgumentError
from engine.store import schemas
from engine.store.commit_markers import CQ_KEY, HWM_KEY, PULL_LOG_MARKS_KEY
from engine.store.data_files import Commit, commit_planned
from engine.store.delta import Snapshot
from engine.store.store import Store

HOUR_MS = 3_600_000

# commitInfo keys that describe the table's state as of a commit and must survive maintenance commits.
# A per-commit key (such as the sequencer's batch id) must never be listed here.
CARRIED_MARKERS: dict[str, tuple[str, ...]] = {
    schemas.COMMIT_LOG: (HWM_KEY,),
    schemas.CONSUME_QUEUE: (CQ_KEY,),
    schemas.PULL_LOG: (PULL_LOG_MARKS_KEY,),
}


def commit(store: Store, name: str, plan: Callable[[Snapshot], Commit | None], operation: str) -> int | None:
    """:func:`engine.store.data_files.commit_planned` carrying table ``name``'s :data:`CARRIED_MARKERS`."""
    return commit_planned(store, name, plan, operation, CARRIED_MARKERS.get(name, ()))


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
