"""Small helpers shared by tests."""

from __future__ import annotations

from engine import Store
from engine.store import schemas


def versions(store: Store) -> dict[str, int]:
    """Current Delta version of every table of a store."""
    return {name: store.version(name) for name in schemas.SCHEMAS}


def commit_log_rows(store: Store) -> list[dict[str, object]]:
    return sorted(store.read(schemas.COMMIT_LOG).to_pylist(), key=lambda r: int(r["physical_offset"]))  # type: ignore[arg-type]
