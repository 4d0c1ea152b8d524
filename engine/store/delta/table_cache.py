"""Decoded Arrow tables kept by the process, bounded by their bytes: the least recently used go
first. One class for every such cache of the store's readers (row groups of point reads, whole
small files of version reads)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable

import pyarrow as pa


class TableCache:
    """Tables by key, at most ``max_bytes`` of them (a table larger than that is not kept).
    Thread-safe. The caller's key must change when what it names does (data files never change
    once written; a local file is known by its identity too)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._tables: OrderedDict[Hashable, pa.Table] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> pa.Table | None:
        with self._lock:
            table = self._tables.get(key)
            if table is not None:
                self._tables.move_to_end(key)
            return table

    def put(self, key: Hashable, table: pa.Table) -> None:
        size = table.get_total_buffer_size()  # nbytes walks every array: 20 times slower
        if size > self.max_bytes:
            return
        with self._lock:
            old = self._tables.pop(key, None)
            if old is not None:
                self._bytes -= old.get_total_buffer_size()
            self._tables[key] = table
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, dropped = self._tables.popitem(last=False)
                self._bytes -= dropped.get_total_buffer_size()
