"""Decoded row groups of the commit log are kept for every reader of the process
(engine.store.delta.file_reader.ROW_GROUPS): a pull that a recent one read the row group of decodes
nothing, whichever group pulls; the cache stays within its bytes."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine import Admin, Message, Producer, PullConsumer, Store
from engine.broker.dispatch import dispatch_pending
from engine.store.delta import file_reader
from engine.store.delta.table_cache import TableCache


def _table(n: int, fill: str = "x") -> pa.Table:
    return pa.table({"v": [fill * 100] * n})


def test_the_least_recently_used_groups_go_first_once_past_the_budget() -> None:
    a, b, c = _table(10, "a"), _table(10, "b"), _table(10, "c")
    cache = TableCache(max_bytes=a.get_total_buffer_size() + b.get_total_buffer_size())
    cache.put(("t", "f", 0), a)
    cache.put(("t", "f", 1), b)
    assert cache.get(("t", "f", 0)) is a  # now the most recently used
    cache.put(("t", "f", 2), c)
    assert cache.get(("t", "f", 1)) is None
    assert cache.get(("t", "f", 0)) is a and cache.get(("t", "f", 2)) is c


def test_a_group_larger_than_the_whole_budget_is_not_kept() -> None:
    big = _table(100)
    cache = TableCache(max_bytes=big.get_total_buffer_size() - 1)
    cache.put(("t", "f", 0), big)
    assert cache.get(("t", "f", 0)) is None


def test_a_second_group_pulling_the_same_messages_decodes_no_row_group(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(file_reader, "ROW_GROUPS", TableCache(64 << 20))
    Admin(store).create_topic("Hot", 1)
    with Producer(store) as producer:
        for i in range(4):
            producer.send_batch([Message("Hot", b"%d-%d" % (i, j)) for j in range(32)], queue_id=0)
    dispatch_pending(store)
    reads: list[Any] = []
    real = pq.ParquetFile.read_row_group

    def counted(self: pq.ParquetFile, i: int, *args: Any, **kwargs: Any) -> pa.Table:
        reads.append(i)
        return real(self, i, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "read_row_group", counted)
    first = [PullConsumer(store, "first").pull("Hot", 0, offset, 32) for offset in (0, 32, 64, 96)]
    decoded = len(reads)
    assert decoded >= 4
    second = [PullConsumer(store, "second").pull("Hot", 0, offset, 32) for offset in (0, 32, 64, 96)]
    assert len(reads) == decoded  # every row group came from the cache
    assert [[m.body for m in r.messages] for r in second] == [[m.body for m in r.messages] for r in first]
    assert [m.body for r in second for m in r.messages] == [
        b"%d-%d" % (i, j) for i in range(4) for j in range(32)
    ]
