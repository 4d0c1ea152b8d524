"""Rows grouped by the queue they belong to, column-wise: each row's rank among the rows of its
queue (in input order) and the queues with their row counts.

Stamping gives a batch's rows of each queue consecutive queue offsets from the queue's next one;
dispatch checks that a version's rows continue their queues densely. Both are this grouping, with
no Python work per row.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


class QueueRuns(NamedTuple):
    """Rows grouped by queue (:func:`queue_runs`)."""

    queues: list[tuple[str, int]]  # the distinct (topic, queue id) pairs
    counts: list[int]  # how many rows each queue has
    group: np.ndarray  # each row's queue: an index into ``queues``
    rank: np.ndarray  # each row's position among its queue's rows, in input order


def queue_runs(topics: pa.Array | pa.ChunkedArray, queue_ids: np.ndarray) -> QueueRuns:
    """The rows of ``topics`` and ``queue_ids`` (non-negative, one per row) grouped by queue."""
    column = topics.combine_chunks() if isinstance(topics, pa.ChunkedArray) else topics
    encoded = pc.dictionary_encode(column)
    names = encoded.dictionary.to_pylist()
    topic_ids = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    qids = np.asarray(queue_ids, dtype=np.int64)
    width = int(qids.max()) + 1 if len(qids) else 1
    key = topic_ids * width + qids
    order = np.argsort(key, kind="stable")
    ordered = key[order]
    rank = np.empty(len(key), dtype=np.int64)
    rank[order] = np.arange(len(key)) - np.searchsorted(ordered, ordered, side="left")
    groups, group, counts = np.unique(key, return_inverse=True, return_counts=True)
    queues = [(names[g // width], g % width) for g in groups.tolist()]
    return QueueRuns(queues, counts.tolist(), group, rank)
