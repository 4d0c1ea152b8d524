"""A raw delta-rs handle on one of a store's tables, for tests that damage or inspect the Delta log
itself (the engine never hands one out: only ``engine/store`` talks to delta-rs)."""

from __future__ import annotations

from deltalake import DeltaTable

from engine.store import Store


def raw_table(store: Store, name: str, version: int | None = None) -> DeltaTable:
    """A new delta-rs handle on table ``name`` of ``store`` (at ``version`` for time travel)."""
    return DeltaTable(store.uri(name), version=version, storage_options=store.storage_options)
