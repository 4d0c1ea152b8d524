"""Storage layer: the only code that talks to Delta tables."""

from engine.store.store import Store

__all__ = ["Store"]
