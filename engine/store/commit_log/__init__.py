"""The commit log's sequencer: offsets assigned once, at commit, with the Delta log as the lock.

- :mod:`.writer`: :class:`CommitLogWriter`, one shard's optimistic sequencer (commit exactly the next
  version; catch up and stamp again after a lost race);
- :mod:`.shards`: :class:`CommitLogs`, a store's shards, a batch split by the shard of its queue;
- :mod:`.stamping`: the pure half of an append (:class:`PendingMessage`, :func:`stamp`) and re-puts
  (:func:`reput`: a new message copied from a stored row);
- :mod:`.marks`, :mod:`.hwm`, :mod:`.saved_marks`: the high-water marks each commit carries, how they
  are read as of a version, and the full marks saved beside each checkpoint;
- :mod:`.pacing`: how racing writers without the host lock take turns;
- :mod:`.reads`: reads that span the shards (which table holds an offset, rows of every shard).

The rest of the engine uses the names below.
"""

from __future__ import annotations

from engine.store.commit_log.hwm import checkpoint_commit_log, marks_after, read_hwm
from engine.store.commit_log.reads import read_commit_logs
from engine.store.commit_log.shards import CommitLogs, ShardPart, shared_commit_logs
from engine.store.commit_log.stamping import (
    PendingBatch,
    PendingMessage,
    Stamped,
    StampedBatch,
    reput,
    row_properties,
)
from engine.store.commit_log.writer import COMMIT_LOG_ROW_GROUP_ROWS, CommitLogWriter, writers_host_lock
from engine.store.delta import LOCK_WAIT_S

__all__ = [
    "COMMIT_LOG_ROW_GROUP_ROWS",
    "LOCK_WAIT_S",
    "CommitLogWriter",
    "CommitLogs",
    "PendingBatch",
    "PendingMessage",
    "ShardPart",
    "Stamped",
    "StampedBatch",
    "checkpoint_commit_log",
    "marks_after",
    "read_commit_logs",
    "read_hwm",
    "reput",
    "row_properties",
    "shared_commit_logs",
    "writers_host_lock",
]
