"""The schedule on a sharded store: deliveries to shards other than the one holding its state.

The schedule's state (:mod:`engine.broker.schedule_state`) lives on the *home* shard, the timer
queue's (:func:`~engine.broker.schedule_state.home_shard`). A due message bound for a queue on
another shard is delivered there, in a commit of that shard that carries the shard's own copy of
the schedule markers, in the same form as the home shard's:

* ``mq.schedule.<level queue>``: the end of the pass's range of that queue (every entry up to it
  bound for this shard is delivered here);
* the timer queue's handled prefix and runs: the timers delivered here, plus what the home shard
  had handled when the pass began;
* ``mq.schedule``: the shard's own counter, +1 per commit, so the commit is a compare-and-swap on
  the shard's state the pass was planned from (two schedulers never both deliver the same range).

A pass commits the other shards first and the home shard last; the home commit (progress of every
queue, timer runs, moves) says the pass is done. A crash between two commits leaves some shards
ahead of the home state: the next pass plans from the home state again and skips what each shard
already covers (a level entry at or below the shard's ``mq.schedule.<queue>``; a timer in the
shard's handled set counts as handled, neither delivered nor moved again), so each message is
delivered exactly once. With one shard there are no other shards and nothing here runs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from engine.broker.schedule_state import ScheduleState, read_state, union_handled
from engine.protocol.schedule import LEVEL_QUEUES, TIMER_QUEUE_ID
from engine.store import schemas
from engine.store.commit_log import CommitLogWriter, PendingMessage
from engine.store.commit_markers import SCHEDULE_APP, SCHEDULE_STATE_KEY, schedule_queue_app
from engine.store.delta import Snapshot
from engine.store.store import Store


class ShardView:
    """A shard other than the home one: the scheduler's private snapshot of it and its schedule
    state (which guards deliveries to it).

    Args:
        shard: the shard.
        levels: the number of level queues.
    """

    def __init__(self, shard: int, levels: int) -> None:
        self.shard = shard
        self.dt: Snapshot | None = None
        self.state = ScheduleState(-1, (-1,) * levels, -1, (), -1)
        self.cached: ScheduleState | None = None  # the state, while no commit may have moved it

    def delivered(self, queue_id: int, offset: int) -> bool:
        """Whether this shard holds the delivery of a level-queue entry already (a timer it
        delivered is never picked again: it counts as handled)."""
        return queue_id != TIMER_QUEUE_ID and offset <= self.state.delivered[queue_id]

    def needs_refresh(self, refresh_versions: int) -> bool:
        """Whether the commit holding its timer runs fell more than ``refresh_versions`` behind."""
        st = self.state
        return (
            bool(st.timer_runs)
            and st.version >= 0
            and self.dt is not None
            and self.dt.version() - st.version > refresh_versions
        )


def read_views(store: Store, home: int, views: dict[int, ShardView]) -> dict[int, ShardView]:
    """Bring ``views`` (made on first use) of every shard but ``home`` up to the latest version,
    with their schedule state; returns ``views``.

    Raises:
        StoreError: a shard is unreadable or the commit holding its timer runs is gone.
    """
    for shard in range(store.commit_log_shards):
        if shard != home:
            view = views.get(shard)
            if view is None:
                view = views[shard] = ShardView(shard, len(LEVEL_QUEUES))
            view.dt = store.caught_up(schemas.commit_log_table(shard), view.dt)
            view.state = read_state(view.dt, view.cached)
            view.cached = view.state
    return views


def commit_deliveries(
    writer: CommitLogWriter,
    view: ShardView,
    home: ScheduleState,
    picked: Sequence[tuple[int, int]],
    messages: Sequence[PendingMessage],
    last: Mapping[int, int],
) -> int | None:
    """Commit ``messages`` (the deliveries of the schedule entries ``picked``, (queue, offset)) to
    ``view``'s shard with its schedule markers; how many were written, or None when another
    scheduler moved the shard's state first (plan again).

    ``home`` is the home shard's state the pass was planned from and ``last`` the pass's end per
    level queue. With no messages it restates the shard's timer state (an empty commit).

    Raises:
        CommitConflictError, StoreError, CommitStateUnknownError: as :meth:`CommitLogWriter.append`.
    """
    st = view.state
    seq = st.seq + 1
    txns = {SCHEDULE_APP: seq}
    for q, off in last.items():
        if off > st.delivered[q]:
            txns[schedule_queue_app(q)] = off
    timers = [offset for q, offset in picked if q == TIMER_QUEUE_ID]
    prefix, runs = union_handled(
        (st.timer_prefix, st.timer_runs), (home.timer_prefix, home.timer_runs), timers
    )
    if prefix > st.timer_prefix:
        txns[schedule_queue_app(TIMER_QUEUE_ID)] = prefix
    metadata = {
        SCHEDULE_STATE_KEY: json.dumps({"seq": seq, "timer": [list(r) for r in runs]}, separators=(",", ":"))
    }
    stamped = writer.append(list(messages), app_transactions=txns, custom_metadata=metadata)
    view.cached = None  # read it again: this commit, or the one that beat it, is the newest
    if messages and not stamped:
        return None
    return len(stamped)
