"""Schedule: delayed and timer messages wait in ``SCHEDULE_TOPIC_XXXX``, then go to their real topic.

Queues of the schedule topic: 0..17 hold delay levels 1..18 (RocketMQ's ``messageDelayLevel``), 18
holds arbitrary-time timers (``Message(deliver_at_ms=...)`` or the ``TIMER_*`` properties). Every
consume-queue entry keeps its due time in the tags-code slot, so deciding what is due reads no
message body.

Delivery re-puts a due message to its ``REAL_TOPIC`` / ``REAL_QID`` as a new commit-log row: same
body, tags, keys, uniq key, born time and reconsume times; without ``DELAY`` and the timer
properties. A delay-level message keeps ``REAL_TOPIC`` / ``REAL_QID`` (RocketMQ's
ScheduleMessageService does); a timer message drops them (its TimerMessageStore does).

Exactly once
------------
Progress lives on the commit log itself, in the same Delta commit as the re-puts:

* app transaction ``mq.schedule.<qid>``: for a level queue, the last delivered queue offset; for
  the timer queue, the *handled prefix* (every offset at or below it was delivered or moved).
* app transaction ``mq.schedule``: a counter, +1 per schedule commit. ``CommitLogWriter`` skips a
  batch when the table already records a version >= the one given for an app id; giving exactly
  counter + 1 turns that into a compare-and-swap on the state the pass was computed from. Without
  it two instances that read the same state with different clocks could both commit overlapping
  deliveries (one through offset 5, the other through 8: offsets 0..5 twice).
* commitInfo ``mq.schedule``: ``{"seq": counter, "timer": [[lo, hi], ...]}``, the timer queue's
  handled runs above its prefix.

A pass reads the state, picks what is due and appends it all in one commit with the markers. A
replayed pass, a restarted job or a second instance finds the counter moved on and reads again.

Timer queue: a handled prefix plus handled runs
-----------------------------------------------
A level queue holds one fixed delay, so due times follow commit order (up to clock skew between
producers) and it is walked in offset order up to the first entry that is not due, as RocketMQ's
per-level timer does. Timers are in commit order but not in due order: a 7-day timer followed by a
1-second one must not hold the latter back. The timer queue therefore delivers *every* due entry
and records what it handled as a contiguous prefix (an app transaction: kept in the snapshot for
good) plus sorted runs ``[lo, hi]`` of handled offsets above it (commitInfo). Runs rather than a
bitmap or a set of offsets: deliveries cluster, so the state grows with the number of not-yet-due
timers stuck *between* delivered ones (the holes), not with the number delivered, and when timers
come due in roughly the order they were sent it stays empty.

The state is bounded: when there are more than ``max_timer_runs`` runs, the entries of the
smallest holes are *moved* (re-put unchanged at the tail of the timer queue, in the same commit)
and count as handled, so runs merge and the prefix advances; one copy of a waiting timer buys one
run less. The commit holding the runs is found by walking the log back to the commit whose
``seq`` equals the counter (cached in process). When it falls more than ``refresh_versions``
behind the latest version while runs exist, an empty commit restates it, so a restart never walks
far and log cleanup never takes it. If it cannot be found, the pass fails with
:class:`~engine.errors.StoreError` rather than risk delivering twice.

On a store of several commit-log shards the state above lives on the timer queue's shard, and a
delivery bound for another shard is committed there with that shard's own markers, before the
state's commit: :mod:`engine.broker.schedule_shards`.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from engine.broker.schedule_shards import ShardView, commit_deliveries, read_views
from engine.broker.schedule_state import (
    HandledRun,
    ScheduleState,
    add_handled,
    handled_mask,
    home_shard,
    read_state,
)
from engine.errors import CommitConflictError, InvalidArgumentError, StoreError
from engine.protocol.names import PROPERTY_REAL_TOPIC, SCHEDULE_TOPIC
from engine.protocol.schedule import LEVEL_QUEUES, TIMER_QUEUE_ID, real_destination
from engine.store import schemas
from engine.store.commit_log import CommitLogs, PendingMessage, reput, row_properties
from engine.store.commit_markers import (
    SCHEDULE_APP,
    SCHEDULE_DROPPED_KEY,
    SCHEDULE_STATE_KEY,
    schedule_queue_app,
)
from engine.store.consume_queue import QueueIndex
from engine.store.delta import Snapshot
from engine.store.store import Store
from engine.store.store import now_ms as _clock_ms

_CHUNK = 1024  # consume-queue entries read at a time
_MAX_LOST_RACES = 64


# ----------------------------------------------------------------- pure helpers
def delivery_of(row: Mapping[str, Any], queues: int | None = None) -> PendingMessage | None:
    """The real-topic message for a due schedule-topic row, or None if the row names no real topic.

    Pure. ``queues`` (the real topic's queue count, when known) folds a ``REAL_QID`` that no longer
    exists onto an existing queue rather than losing the message.
    """
    destination = real_destination(row_properties(row), queues)
    if destination is None:
        return None
    return reput(row, **destination._asdict(), reconsume_times=int(row.get("reconsume_times") or 0))


def moved_copy(row: Mapping[str, Any]) -> PendingMessage:
    """An unchanged copy of a waiting timer, re-put at the tail of the timer queue; pure."""
    return reput(
        row,
        topic=SCHEDULE_TOPIC,
        queue_id=TIMER_QUEUE_ID,
        properties=row_properties(row),
        delay_level=int(row.get("delay_level") or 0),
        deliver_at_ms=row.get("deliver_at_ms"),
        reconsume_times=int(row.get("reconsume_times") or 0),
        tags_code=int(row["tags_code"]),
    )


# ----------------------------------------------------------------- the scheduler
class _Pick(NamedTuple):
    due: int
    queue_id: int
    offset: int
    physical: int


class _Budget:
    """Most messages and bytes one pass re-puts (at least one message)."""

    def __init__(self, count: int, size: int) -> None:
        self.count = count
        self.size = size
        self.taken = 0

    def take(self, sizes: np.ndarray) -> int:
        n = 0
        for s in sizes.tolist():
            if self.count <= 0 or (self.size < s and self.taken):
                break
            self.count -= 1
            self.size -= s
            self.taken += 1
            n += 1
        return n

    @property
    def exhausted(self) -> bool:
        return self.count <= 0 or self.size <= 0


class _TimerCache:
    """Timer-queue entries not handled as of some earlier state, up to ``scanned`` (exclusive).

    Handled offsets only ever grow, so filtering this by a fresh state gives every unhandled entry
    below ``scanned`` without reading the consume queue again.
    """

    def __init__(self) -> None:
        self.scanned = -1
        self.offsets = np.empty(0, np.int64)
        self.dues = np.empty(0, np.int64)
        self.sizes = np.empty(0, np.int64)
        self.physical = np.empty(0, np.int64)

    def extend(self, entries: pa.Table) -> None:
        self.offsets = np.concatenate((self.offsets, entries["queue_offset"].to_numpy()))
        self.dues = np.concatenate((self.dues, entries["tags_code"].to_numpy()))
        self.sizes = np.concatenate((self.sizes, entries["size"].to_numpy().astype(np.int64)))
        self.physical = np.concatenate((self.physical, entries["physical_offset"].to_numpy()))

    def keep(self, mask: np.ndarray) -> None:
        self.offsets, self.dues = self.offsets[mask], self.dues[mask]
        self.sizes, self.physical = self.sizes[mask], self.physical[mask]


class Scheduler:
    """Delivers due messages of the schedule topic; one per job (it caches state between passes).

    Thread-safe; any number of schedulers, in any processes, may run against one store: each
    message is delivered exactly once.

    Args:
        store: an open store. Its schedule-topic entries must have been dispatched (the dispatch
            job, or :func:`engine.store.dispatch.dispatch_pending`).
        max_messages_per_pass: most messages re-put in one commit.
        max_bytes_per_pass: most message bytes re-put in one commit (at least one message).
        max_timer_runs: handled runs of the timer queue kept before waiting timers are moved.
        refresh_versions: how far behind the latest commit-log version the state commit may fall
            (while runs exist) before an empty commit restates it.
    """

    def __init__(
        self,
        store: Store,
        *,
        max_messages_per_pass: int = 4096,
        max_bytes_per_pass: int = 64 * 1024 * 1024,
        max_timer_runs: int = 256,
        refresh_versions: int = 2000,
    ) -> None:
        for name, value in (
            ("max_messages_per_pass", max_messages_per_pass),
            ("max_bytes_per_pass", max_bytes_per_pass),
            ("max_timer_runs", max_timer_runs),
            ("refresh_versions", refresh_versions),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 2:
                raise InvalidArgumentError(f"{name} must be an int >= 2, got {value!r}", **{name: value})
        self._store = store
        self._home = home_shard(store)
        self._writers = CommitLogs(store)
        self._writer = self._writers.writer(self._home)  # the state's shard
        self._others: dict[int, ShardView] = {}  # other shards: private snapshot and state
        self._index = QueueIndex(store)
        self._lock = threading.Lock()
        self._max_messages = max_messages_per_pass
        self._max_bytes = max_bytes_per_pass
        self._max_runs = max_timer_runs
        self._refresh_versions = refresh_versions
        self._state: ScheduleState | None = None
        self._dt: Snapshot | None = None
        self._heads: dict[int, tuple[int, int]] = {}  # level queue -> (offset, due) of a head not due
        self._timers = _TimerCache()
        self.delivered = 0  # messages re-put to their real topic by this scheduler
        self.moved = 0  # waiting timers moved to the tail of the timer queue
        self.lost_races = 0  # passes another writer got to first

    # ------------------------------------------------------------- public
    def deliver_due(self, now_ms: int | None = None) -> int:
        """Re-put every schedule message due at ``now_ms`` (default: now); returns how many.

        Idempotent and exactly once: what another instance (or an earlier call) delivered is not
        delivered again. Works in passes of at most ``max_messages_per_pass`` messages, one
        commit each, until nothing due is left.

        Raises:
            InvalidArgumentError: ``now_ms`` is not a non-negative int.
            StoreError: the commit log or consume queue is unreadable, or the timer state is lost.
            CommitConflictError: lost every race for the commit log.
        """
        if now_ms is not None and (isinstance(now_ms, bool) or not isinstance(now_ms, int) or now_ms < 0):
            raise InvalidArgumentError(
                f"now_ms {now_ms!r} must be a non-negative epoch-ms int", now_ms=now_ms
            )
        lost = 0
        with self._lock:
            before = self.delivered
            while True:
                now = _clock_ms() if now_ms is None else now_ms
                outcome = self._pass(now)
                if outcome is None:
                    lost += 1
                    self.lost_races += 1
                    if lost >= _MAX_LOST_RACES:
                        raise CommitConflictError(
                            f"schedule delivery lost {lost} races in a row", table=schemas.COMMIT_LOG
                        )
                    continue
                _, more = outcome
                if not more:
                    return self.delivered - before

    def next_due_ms(self) -> int | None:
        """The earliest due time (epoch ms) of a message this scheduler has seen waiting (the heads
        of the delay levels, the timers read) as of its last pass; None when it saw none.
        A hint for when to deliver next: messages stored since the last pass are not in it."""
        with self._lock:
            state, cache = self._state, self._timers
            dues = [
                due
                for qid, (offset, due) in self._heads.items()
                if state is None or offset > state.delivered[qid]  # not delivered since
            ]
            waiting = cache.dues
            if state is not None and waiting.size:
                waiting = waiting[~handled_mask(state.timer_prefix, state.timer_runs, cache.offsets)]
            if waiting.size:
                dues.append(int(waiting.min()))
            return min(dues) if dues else None

    # ------------------------------------------------------------- one pass
    def _read_state(self, dt: Snapshot) -> ScheduleState:
        self._state = state = read_state(dt, self._state)
        return state

    def _idle(self, now: int) -> bool:
        """Whether a pass would find nothing to do, judged from the state of the last pass and the
        consume queue (no read of the commit log: catching its snapshot up through delta-rs cost
        about 200 ms a round under load, with no delayed message anywhere). Idle when no schedule
        queue holds an entry that pass did not see, none it saw is due, and no restating commit is
        owed. The state may be older than the log's (another scheduler delivered since): that only
        makes less work, never more. Not judged on a store of several shards."""
        state = self._state
        if state is None or self._store.commit_log_shards > 1:
            return False
        for qid in LEVEL_QUEUES:
            low, high = self._index.bounds(SCHEDULE_TOPIC, qid)
            pos = max(state.delivered[qid] + 1, low)
            head = self._heads.get(qid)
            if pos < high and (head is None or head[0] != pos or head[1] <= now):
                return False
        cache = self._timers
        if self._index.bounds(SCHEDULE_TOPIC, TIMER_QUEUE_ID)[1] > cache.scanned:
            return False
        if cache.dues.size:
            waiting = ~handled_mask(state.timer_prefix, state.timer_runs, cache.offsets)
            if bool(np.any(cache.dues[waiting] <= now)):
                return False
        if state.timer_runs and state.version >= 0:
            latest = self._store.latest_version_hint(self._writer.table, state.version)
            if latest - state.version > self._refresh_versions // 2:
                return False  # let the pass see whether the state must be restated
        return True

    def _pass(self, now: int) -> tuple[int, bool] | None:
        """One commit's worth: (delivered, maybe more due), or None when another writer won."""
        # What dispatch committed (the store's contract above), not the commit-log versions after
        # it: planning those cost a re-read of every new commit-log version each pass (a fifth of
        # the broker loop's CPU under load), and what they hold is delivered once dispatched.
        # The whole consume queue is caught up only when the schedule topic's bounds moved, or
        # when the index as it stands says there is work (what that work reads must be there).
        if not self._index.topic_moved(SCHEDULE_TOPIC) and self._idle(now):
            return 0, False
        self._index.refresh(tail=False)
        if self._idle(now):
            return 0, False
        self._dt = self._store.caught_up(self._writer.table, self._dt)
        dt = self._dt  # a private snapshot: every part of the state comes from one version
        state = self._read_state(dt)
        others = read_views(self._store, self._home, self._others)
        budget = _Budget(self._max_messages, self._max_bytes)
        picks: list[_Pick] = []
        last: dict[int, int] = {}
        for qid in LEVEL_QUEUES:
            if budget.exhausted:
                break
            self._scan_level(qid, state.delivered[qid], now, budget, picks, last)
        timer_picks, moves, prefix, runs = self._scan_timer(state, now, budget, others)
        picks.extend(timer_picks)
        refresh = bool(runs) and state.version >= 0 and dt.version() - state.version > self._refresh_versions
        changed = bool(picks or moves) or prefix != state.timer_prefix or runs != state.timer_runs
        stale = [v for v in others.values() if v.needs_refresh(self._refresh_versions)]
        if not changed and not refresh:
            for view in stale:
                self._commit_other(view, state, [], {})
            return 0, False

        picks.sort()
        rows = self._rows([p.physical for p in picks] + [int(p) for p in moves])
        configs = self._store.topic_configs()
        messages: list[PendingMessage] = []
        elsewhere: dict[int, list[tuple[_Pick, PendingMessage]]] = {}  # other shards' deliveries
        dropped: list[str] = []
        for pick in picks:
            row = rows[pick.physical]
            config = configs.get(str(row_properties(row).get(PROPERTY_REAL_TOPIC)))
            message = delivery_of(row, config.queues if config is not None else None)
            if row["topic"] != SCHEDULE_TOPIC or message is None:
                dropped.append(str(row["msg_id"]))  # unroutable: handled, so it cannot block its queue
                continue
            shard = self._writers.shard_of(message.topic, message.queue_id)
            if shard == self._home:
                messages.append(message)
            elif not others[shard].delivered(pick.queue_id, pick.offset):
                elsewhere.setdefault(shard, []).append((pick, message))
        # Other shards first, the state's shard last: its commit says the whole pass is done.
        for shard in sorted(set(elsewhere) | {v.shard for v in stale}):
            if not self._commit_other(others[shard], state, elsewhere.get(shard, []), last):
                self._state = None
                return None
        delivered = len(messages)
        messages.extend(moved_copy(rows[int(p)]) for p in moves)

        seq = state.seq + 1
        txns = {SCHEDULE_APP: seq, **{schedule_queue_app(q): off for q, off in last.items()}}
        if prefix > state.timer_prefix:
            txns[schedule_queue_app(TIMER_QUEUE_ID)] = prefix
        metadata = {
            SCHEDULE_STATE_KEY: json.dumps(
                {"seq": seq, "timer": [list(r) for r in runs]}, separators=(",", ":")
            )
        }
        if dropped:
            metadata[SCHEDULE_DROPPED_KEY] = json.dumps(dropped)
        stamped = self._writer.append(messages, app_transactions=txns, custom_metadata=metadata)
        if messages and not stamped:
            self._state = None
            return None
        if not messages:
            # An empty commit cannot tell us whether it won: read the state again next pass.
            self._state = None
            return 0, True
        new_delivered = list(state.delivered)
        for q, off in last.items():
            new_delivered[q] = off
        self._state = ScheduleState(seq, tuple(new_delivered), prefix, runs, stamped[0].version)
        self.delivered += delivered
        self.moved += len(moves)
        return delivered, budget.exhausted

    def _scan_level(
        self, qid: int, delivered: int, now: int, budget: _Budget, picks: list[_Pick], last: dict[int, int]
    ) -> None:
        """Walk a level queue in offset order while entries are due (FIFO by due time)."""
        low, high = self._index.bounds(SCHEDULE_TOPIC, qid)
        pos = max(delivered + 1, low)
        if pos >= high:
            return
        head = self._heads.get(qid)
        if head is not None and head[0] == pos and head[1] > now:
            return
        while pos < high and not budget.exhausted:
            end = min(high, pos + _CHUNK)
            entries = self._index.entries(SCHEDULE_TOPIC, qid, pos, end)
            offsets = entries["queue_offset"].to_numpy()
            if entries.num_rows != end - pos or int(offsets[0]) != pos:
                raise StoreError(
                    f"schedule queue {qid} has a gap at offset {pos}: the consume queue is incomplete",
                    topic=SCHEDULE_TOPIC,
                    queue_id=qid,
                    offset=pos,
                )
            dues = entries["tags_code"].to_numpy()
            not_due = np.nonzero(dues > now)[0]
            limit = int(not_due[0]) if not_due.size else entries.num_rows
            n = budget.take(entries["size"].to_numpy()[:limit])
            physical = entries["physical_offset"].to_numpy()
            for i in range(n):
                picks.append(_Pick(int(dues[i]), qid, pos + i, int(physical[i])))
            if n:
                last[qid] = pos + n - 1
            if n < entries.num_rows:
                if n == limit and not_due.size:
                    self._heads[qid] = (pos + n, int(dues[n]))
                return
            pos = end

    def _scan_timer(
        self, state: ScheduleState, now: int, budget: _Budget, others: Mapping[int, ShardView]
    ) -> tuple[list[_Pick], list[int], int, tuple[HandledRun, ...]]:
        """Every due timer (earliest first, within the budget), the physical offsets of timers to
        move, and the new (prefix, runs). Timers another shard already delivered (a pass cut short
        before its last commit) count as handled and are neither delivered nor moved again."""
        cache = self._timers
        low, high = self._index.bounds(SCHEDULE_TOPIC, TIMER_QUEUE_ID)
        pos = max(state.timer_prefix + 1, cache.scanned, low)
        while pos < high:
            end = min(high, pos + 64 * _CHUNK)
            cache.extend(self._index.entries(SCHEDULE_TOPIC, TIMER_QUEUE_ID, pos, end))
            pos = end
        cache.scanned = max(cache.scanned, high)
        cache.keep(
            ~handled_mask(state.timer_prefix, state.timer_runs, cache.offsets) & (cache.offsets >= low)
        )

        done = np.zeros(cache.offsets.size, dtype=bool)
        for view in others.values():
            done |= handled_mask(view.state.timer_prefix, view.state.timer_runs, cache.offsets)
        due = np.nonzero((cache.dues <= now) & ~done)[0]
        due = due[np.lexsort((cache.offsets[due], cache.dues[due]))]
        n = budget.take(cache.sizes[due]) if due.size and not budget.exhausted else 0
        chosen = due[:n]
        picks = [
            _Pick(int(cache.dues[i]), TIMER_QUEUE_ID, int(cache.offsets[i]), int(cache.physical[i]))
            for i in chosen.tolist()
        ]
        # Entries below the queue's minimum offset are gone (retention): nothing left to deliver.
        base = max(state.timer_prefix, low - 1)
        handled = [p.offset for p in picks] + cache.offsets[done].tolist()
        prefix, runs = add_handled(base, state.timer_runs, handled)
        moves: list[int] = []
        if len(runs) > self._max_runs:
            waiting = ~done
            waiting[chosen] = False
            moved = self._holes_to_move(prefix, runs, cache.offsets[waiting], cache.sizes[waiting], budget)
            if moved.size:
                index = np.nonzero(np.isin(cache.offsets, moved))[0]
                moves = cache.physical[index].tolist()
                prefix, runs = add_handled(prefix, runs, moved.tolist())
        return picks, moves, prefix, runs

    def _holes_to_move(
        self,
        prefix: int,
        runs: tuple[HandledRun, ...],
        offsets: np.ndarray,
        sizes: np.ndarray,
        budget: _Budget,
    ) -> np.ndarray:
        """Offsets of the waiting timers in the smallest holes, enough to halve the runs."""
        order = np.argsort(offsets)
        offsets, sizes = offsets[order], sizes[order]
        holes = []
        for i, (lo, _) in enumerate(runs):
            start = prefix + 1 if i == 0 else runs[i - 1][1] + 1
            a, b = np.searchsorted(offsets, [start, lo], side="left").tolist()
            holes.append((b - a, a, b))
        holes.sort()
        wanted = len(runs) - self._max_runs // 2
        chosen: list[np.ndarray] = []
        for count, a, b in holes[:wanted]:
            if count > budget.count or (budget.taken and int(sizes[a:b].sum()) > budget.size):
                break  # a partly moved hole would not merge its runs; the next pass goes on
            budget.take(sizes[a:b])
            chosen.append(offsets[a:b])
        return np.concatenate(chosen) if chosen else np.empty(0, np.int64)

    def _commit_other(
        self,
        view: ShardView,
        home: ScheduleState,
        deliveries: list[tuple[_Pick, PendingMessage]],
        last: Mapping[int, int],
    ) -> bool:
        """Commit one other shard's deliveries with its own progress; False when it lost a race."""
        done = [(p.queue_id, p.offset) for p, _ in deliveries]
        stamped = commit_deliveries(
            self._writers.writer(view.shard), view, home, done, [m for _, m in deliveries], last
        )
        if stamped is None:
            return False
        self.delivered += stamped
        return True

    def _rows(self, physical: list[int]) -> dict[int, dict[str, Any]]:
        if not physical:
            return {}
        table = self._index.messages(physical)
        return {int(r["physical_offset"]): r for r in table.to_pylist()}


def deliver_due(store: Store, now_ms: int | None = None) -> int:
    """Deliver every schedule-topic message due at ``now_ms`` (default: now); returns how many.

    Exactly once across calls, processes and restarts (see the module docstring). A long-running
    job should keep one :class:`Scheduler` instead, which caches its state between calls.

    Raises:
        InvalidArgumentError: ``now_ms`` is not a non-negative int.
        StoreError: a table is unreadable or the timer state is lost.
        CommitConflictError: lost every race for the commit log.
    """
    return Scheduler(store).deliver_due(now_ms)
