"""Helpers of the endpoint tests."""

from __future__ import annotations

from engine import Store
from engine.store import schemas

FAR_FUTURE_MS = 4_102_444_800_000  # 2100-01-01


def versions(store: Store) -> dict[str, int]:
    """The Delta version of every table of the store."""
    return {name: store.version(name) for name in schemas.SCHEMAS}
