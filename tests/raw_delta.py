"""A raw delta-rs handle on one of a store's tables, for tests that damage or inspect the Delta log
itself (the engine never hands one out: only ``engine/store`` talks to delta-rs)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from deltalake import DeltaTable

from engine.store import Store
from engine.store.delta.snapshot import listing_gap

T = TypeVar("T")

# A listing of the log racing another process's commit can miss one commit file and see the next
# (delta-rs: "Expected contiguous commit files"); the engine reads again, and so do these helpers.
GAP_RETRIES = 50


def through_gaps(read: Callable[[], T]) -> T:
    """``read()``, again while it fails on a listing of the log that raced a writer's commit."""
    for _ in range(GAP_RETRIES - 1):
        try:
            return read()
        except Exception as exc:
            if not listing_gap(exc):
                raise
            time.sleep(0.01)
    return read()


def raw_table(store: Store, name: str, version: int | None = None) -> DeltaTable:
    """A new delta-rs handle on table ``name`` of ``store`` (at ``version`` for time travel)."""
    uri, options = store.uri(name), store.storage_options
    return through_gaps(lambda: DeltaTable(uri, version=version, storage_options=options))
