"""The schedule's progress: what it has delivered, as recorded on the commit log.

Per level queue, the app transaction ``mq.schedule.<qid>`` holds the last delivered queue offset;
for the timer queue it holds the handled prefix, and the handled runs above the prefix are in the
commitInfo (``mq.schedule``) of the commit whose ``seq`` equals the ``mq.schedule`` counter. See
:mod:`engine.broker.schedule` for why.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from engine.errors import StoreError
from engine.protocol.names import SCHEDULE_TOPIC
from engine.protocol.schedule import LEVEL_QUEUES, TIMER_QUEUE_ID
from engine.protocol.shards import shard_of_queue
from engine.store import schemas
from engine.store.commit_markers import SCHEDULE_APP, SCHEDULE_STATE_KEY, schedule_queue_app
from engine.store.delta import Snapshot
from engine.store.store import Store

# Offsets lo..hi (both included) of the timer queue, all handled.
HandledRun = tuple[int, int]


# ----------------------------------------------------------------- pure helpers
def add_handled(
    prefix: int, runs: Sequence[HandledRun], offsets: Iterable[int]
) -> tuple[int, tuple[HandledRun, ...]]:
    """Merge handled ``offsets`` into a (prefix, runs) state; pure.

    Runs come back sorted, disjoint, non-adjacent and above the prefix; a run that reaches the
    prefix is absorbed into it.
    """
    arr = np.unique(np.fromiter(offsets, dtype=np.int64))
    pieces: list[HandledRun] = list(runs)
    if arr.size:
        breaks = np.nonzero(np.diff(arr) != 1)[0]
        starts = np.concatenate((arr[:1], arr[breaks + 1]))
        ends = np.concatenate((arr[breaks], arr[-1:]))
        pieces.extend(zip(starts.tolist(), ends.tolist(), strict=True))
    pieces.sort()
    merged: list[list[int]] = []
    for lo, hi in pieces:
        if hi <= prefix:
            continue
        lo = max(lo, prefix + 1)
        if merged and lo <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    while merged and merged[0][0] <= prefix + 1:
        prefix = max(prefix, merged.pop(0)[1])
    return prefix, tuple((lo, hi) for lo, hi in merged)


def handled_mask(prefix: int, runs: Sequence[HandledRun], offsets: np.ndarray) -> np.ndarray:
    """For each offset: True when the (prefix, runs) state says it was handled; pure."""
    mask = offsets <= prefix
    if runs and offsets.size:
        starts = np.array([r[0] for r in runs], dtype=np.int64)
        ends = np.array([r[1] for r in runs], dtype=np.int64)
        idx = np.searchsorted(starts, offsets, side="right") - 1
        inside = (idx >= 0) & (offsets <= ends[np.clip(idx, 0, None)])
        mask = mask | inside
    return np.asarray(mask, dtype=bool)


# ----------------------------------------------------------------- state
@dataclass(frozen=True)
class ScheduleState:
    """What the schedule has handled, as of one commit-log version."""

    seq: int  # the mq.schedule counter (-1 before the first schedule commit)
    delivered: tuple[int, ...]  # per level queue: last delivered queue offset (-1: none)
    timer_prefix: int
    timer_runs: tuple[HandledRun, ...]
    version: int  # commit-log version whose commitInfo holds timer_runs (-1: none)


def _find_state_commit(dt: Snapshot, seq: int) -> tuple[int, tuple[HandledRun, ...]]:
    """The version of the commit holding the schedule state ``seq``, and its timer runs."""

    def has_seq(raw: str) -> bool:
        return int(json.loads(raw).get("seq", -2)) == seq

    found = dt.find_commit_value(SCHEDULE_STATE_KEY, has_seq, walk_back=None)
    if found is None:
        raise StoreError(
            f"the schedule's state commit (seq {seq}) is no longer in the commit-log history; refusing "
            "to deliver timers that may have been delivered already",
            table=dt.name,
            seq=seq,
        )
    version, raw = found
    runs = tuple((int(lo), int(hi)) for lo, hi in json.loads(raw).get("timer", []))
    return version, runs


def home_shard(store: Store) -> int:
    """The shard whose commit log holds the schedule's state: the timer queue's (0 with one shard).

    Moves of waiting timers re-put them in the timer queue, so they and the state that counts
    them handled land in one commit.
    """
    return shard_of_queue(SCHEDULE_TOPIC, TIMER_QUEUE_ID, store.commit_log_shards)


def union_handled(
    a: tuple[int, Sequence[HandledRun]], b: tuple[int, Sequence[HandledRun]], offsets: Iterable[int] = ()
) -> tuple[int, tuple[HandledRun, ...]]:
    """The (prefix, runs) state holding every offset of states ``a`` and ``b`` and ``offsets``; pure."""
    return add_handled(max(a[0], b[0]), (*a[1], *b[1]), offsets)


def schedule_progress(store: Store) -> dict[int, int]:
    """Per schedule queue: last delivered offset (level queues) or handled prefix (timer queue)."""
    dt = store.shared(schemas.commit_log_table(home_shard(store)))
    queues = (*LEVEL_QUEUES, TIMER_QUEUE_ID)
    versions = dt.app_versions([schedule_queue_app(q) for q in queues])
    return {q: versions[schedule_queue_app(q)] for q in queues}


def read_state(dt: Snapshot, cached: ScheduleState | None = None) -> ScheduleState:
    """The schedule's state as of the commit-log snapshot ``dt``.

    ``cached``, an earlier state, saves walking the log back for the timer runs while its ``seq``
    is still the current one.

    Raises:
        StoreError: the commit holding the timer runs is no longer in the history.
    """
    versions = dt.app_versions(
        [SCHEDULE_APP, *(schedule_queue_app(q) for q in (*LEVEL_QUEUES, TIMER_QUEUE_ID))]
    )
    seq = versions[SCHEDULE_APP]
    delivered = tuple(versions[schedule_queue_app(q)] for q in LEVEL_QUEUES)
    prefix = versions[schedule_queue_app(TIMER_QUEUE_ID)]
    if seq < 0:
        runs: tuple[HandledRun, ...] = ()
        version = -1
    elif cached is not None and cached.seq == seq:
        runs, version = cached.timer_runs, cached.version
    else:
        version, runs = _find_state_commit(dt, seq)
    return ScheduleState(seq, delivered, prefix, runs, version)
