"""Retry and dead letters: NACKed messages go back to their group through ``%RETRY%<group>``.

A consumer that gives up on a message (PushConsumer's RECONSUME_LATER, SimpleConsumer's nack or an
invisible deadline that expired) records a ``NACK`` (or ``EXPIRED``) row in ``action_log``. This
module turns those rows into re-puts on the commit log, as RocketMQ's ``consumerSendMsgBack``:

* ``reconsume_times + 1 <= max`` -> a retry: stored in ``SCHEDULE_TOPIC_XXXX`` at delay level
  ``3 + reconsume_times`` (capped at 18; the first retry waits 10 s) with ``REAL_TOPIC =
  %RETRY%<group>``, ``REAL_QID = 0``; the schedule (:mod:`engine.broker.schedule`) delivers it when
  due. ``reconsume_times`` and the ``RECONSUME_TIME`` property become ``reconsume_times + 1``.
  A NACK with ``deadline_ms`` (a PushConsumer listener's ``delay_level_when_next_consume``) waits
  as a timer until then instead.
* otherwise -> a dead letter in ``%DLQ%<group>`` (one queue), delivered at once, with the same
  ``reconsume_times + 1`` (the number of failed deliveries).

``reconsume_times`` is the larger of the stored message's and the failure row's: a SimpleConsumer
redelivers from the original queue and counts deliveries in the row, and a PushConsumer with a lower
per-consumer maximum raises the row's count to dead-letter early.

Both keep body, tags, keys, uniq key (the id consumers see) and born time, and carry the history:
``ORIGIN_MESSAGE_ID`` (offset msg id of the first failed copy, kept across retries),
``RETRY_TOPIC`` (the original topic, kept across retries; RocketMQ's name for it) and
``RECONSUME_TIME``. ``%RETRY%<group>`` and ``%DLQ%<group>`` are created on first use (1 queue).

The maximum is, in order of precedence: the message's ``MAX_RECONSUME_TIMES`` property, the
group's setting (``max_reconsume_times={group: n}``), ``max_reconsume_times=n`` for every group,
``EngineConfig.max_reconsume_times`` (16).

Exactly once: every re-put of one ``action_log`` version range is appended in ONE commit-log
commit together with two app transactions: ``mq.retry`` = the last action-log version routed (the
job's progress, where a restart resumes) and ``mq.retry.seq`` = a counter, exactly +1 per commit,
which makes the commit a compare-and-swap on the progress it was computed from (two instances that
read the same progress but different ranges cannot both commit). A replayed micro-batch, a
restart or a second instance therefore routes nothing twice. Within a range, two failure rows for
the same (group, physical offset) route the message once. A row whose message cannot be read
(removed by retention, a wrong offset, an id mismatch) is skipped and named in the commit's
``mq.retry.skipped`` metadata rather than blocking the job.

Shards: a re-put goes to the shard of its queue (the schedule topic's level or timer queue, or
``%DLQ%<group>`` queue 0), so one routed range may write several shards. Each shard keeps its own
``mq.retry`` / ``mq.retry.seq`` in its commits: a shard's commit holds the re-puts of the range
(its ``mq.retry`` + 1 .. covered) bound for that shard, so a crash between two shards' commits
re-plans from the least-advanced shard (:func:`routed_version`) and each shard skips what it
already covers: no failure is routed twice on one shard, none is lost. A shard with nothing to
write in a range records its progress only every :data:`ADVANCE_EVERY` versions (shard 0 also when
the range held failures, for ``mq.retry.skipped``). With one shard this is the single commit above.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from engine.errors import CommitConflictError, InvalidArgumentError, StoreError
from engine.model import UNDISPATCHED_FLAGS
from engine.protocol.actions import NACK, ROUTED_ACTIONS
from engine.protocol.delays import (
    MaxReconsume,
    is_dead_letter,
    max_reconsume_times,
    retry_delay_level,
    validate_max_reconsume,
)
from engine.protocol.names import (
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_RECONSUME_TIME,
    PROPERTY_RETRY_TOPIC,
    SCHEDULE_TOPIC,
    dlq_topic,
    retry_topic,
)
from engine.protocol.schedule import schedule_envelope, without_schedule_properties
from engine.protocol.topics import system_topic_config
from engine.store import schemas
from engine.store.commit_log import CommitLogs, PendingMessage, reput, row_properties
from engine.store.commit_markers import RETRY_APP, RETRY_GUARD_APP, RETRY_RANGE_KEY, RETRY_SKIPPED_KEY
from engine.store.consume_queue import QueueIndex
from engine.store.delta import VERSION_COLUMN, Snapshot
from engine.store.store import Store
from engine.store.store import now_ms as _clock_ms

# Columns of action_log the router reads (a stream may select just these, plus ``_version``).
ROUTE_COLUMNS = ("group", "action", "physical_offset", "msg_id", "reconsume_times", "deadline_ms")
# ``deadline_ms`` of a NACK is a retry time the consumer chose (RocketMQ's
# delayLevelWhenNextConsume); rows without the column retry after the broker's delay.
_OPTIONAL_COLUMNS = frozenset({"deadline_ms"})
# With no failure in a range, progress is committed (as an empty commit) only every this many
# action-log versions: a restart re-reads at most that many versions, and quiet consumers do not
# fill the commit log with empty commits.
ADVANCE_EVERY = 64
_MAX_LOST_RACES = 64
_MAX_SKIPPED_LISTED = 100


# ----------------------------------------------------------------- pure rules
def _history(row: Mapping[str, Any]) -> dict[str, str]:
    """The failed message's properties with the failure history filled in."""
    props = without_schedule_properties(row_properties(row))
    props.setdefault(PROPERTY_ORIGIN_MESSAGE_ID, str(row["msg_id"]))
    props.setdefault(PROPERTY_RETRY_TOPIC, str(row["topic"]))
    props[PROPERTY_RECONSUME_TIME] = str(int(row.get("reconsume_times") or 0) + 1)
    return props


def retry_message(
    row: Mapping[str, Any], group: str, now_ms: int, retry_at_ms: int | None = None
) -> PendingMessage:
    """The schedule-topic copy that brings a failed message back to ``%RETRY%<group>``: after delay
    level 3 + reconsume times, or at ``retry_at_ms`` when the consumer chose a time; pure."""
    times = int(row.get("reconsume_times") or 0)
    if retry_at_ms is not None:
        envelope = schedule_envelope(
            retry_topic(group), 0, _history(row), sent_ms=now_ms, deliver_at_ms=max(retry_at_ms, now_ms)
        )
    else:
        envelope = schedule_envelope(
            retry_topic(group), 0, _history(row), sent_ms=now_ms, delay_level=retry_delay_level(times)
        )
    return reput(row, **envelope._asdict(), reconsume_times=times + 1)


def dead_letter(row: Mapping[str, Any], group: str) -> PendingMessage:
    """The ``%DLQ%<group>`` copy of a message that failed too often; pure."""
    times = int(row.get("reconsume_times") or 0)
    return reput(row, topic=dlq_topic(group), queue_id=0, properties=_history(row), reconsume_times=times + 1)


def route_message(
    row: Mapping[str, Any],
    group: str,
    now_ms: int,
    setting: MaxReconsume = None,
    default: int = 16,
    retry_at_ms: int | None = None,
) -> PendingMessage:
    """Retry (at ``retry_at_ms`` when given) or dead letter for one failed message (a commit-log
    row); pure."""
    limit = max_reconsume_times(row_properties(row), group, setting, default)
    if is_dead_letter(int(row.get("reconsume_times") or 0), limit):
        return dead_letter(row, group)
    return retry_message(row, group, now_ms, retry_at_ms)


# ----------------------------------------------------------------- store level
def routed_version(store: Store) -> int:
    """Last ``action_log`` version whose failures are routed on every shard (-1 before any)."""
    return min(store.app_version(table, RETRY_APP) for table in store.commit_logs)


class RetryRouter:
    """Routes failure rows of ``action_log`` to retry and dead-letter topics; one per job.

    Thread-safe. Any number of routers, in any processes, may run against one store.

    Args:
        store: an open store.
        max_reconsume_times: an int for every group, or a mapping group -> int; default the
            engine config's ``max_reconsume_times`` (16). A message's own ``MAX_RECONSUME_TIMES``
            property wins over both.

    Raises:
        InvalidArgumentError: a bad ``max_reconsume_times``.
    """

    def __init__(self, store: Store, *, max_reconsume_times: MaxReconsume = None) -> None:
        self._store = store
        self._setting = validate_max_reconsume(max_reconsume_times)
        self._writers = CommitLogs(store)
        self._writer = self._writers.writer(0)  # shard 0's
        self._index = QueueIndex(store)
        self._ensured: set[str] = set()
        self._dts: dict[int, Snapshot] = {}  # private snapshots: the state and the decision agree
        self._lock = threading.Lock()
        self.retried = 0
        self.dead = 0
        self.skipped = 0

    def route(self, rows: pa.Table, now_ms: int | None = None) -> int:
        """Route the failure rows among ``rows`` (action-log rows carrying ``_version``).

        Called once per micro-batch; idempotent per action-log version: rows of versions already
        routed (by anyone) are dropped. Returns the messages re-put by this call.

        Raises:
            InvalidArgumentError: ``rows`` lacks ``_version`` or a routing column.
            StoreError: the commit log is unreadable or the write failed.
            CommitConflictError: lost every race for the commit log.
        """
        if now_ms is not None and (isinstance(now_ms, bool) or not isinstance(now_ms, int) or now_ms < 0):
            raise InvalidArgumentError(
                f"now_ms {now_ms!r} must be a non-negative epoch-ms int", now_ms=now_ms
            )
        missing = [
            c
            for c in (*ROUTE_COLUMNS, VERSION_COLUMN)
            if c not in rows.column_names and c not in _OPTIONAL_COLUMNS
        ]
        if missing:
            raise InvalidArgumentError(f"action rows lack columns {missing}", missing=missing)
        routed = 0
        with self._lock:
            for _ in range(_MAX_LOST_RACES):
                states = self._states()
                start = min(progress for progress, _ in states)
                fresh = rows.filter(pc.greater(rows[VERSION_COLUMN], start))
                if fresh.num_rows == 0:
                    return routed
                covered = int(pc.max(fresh[VERSION_COLUMN]).as_py())
                failures = fresh.filter(
                    pc.is_in(fresh["action"], value_set=pa.array(sorted(ROUTED_ACTIONS), pa.string()))
                )
                if failures.num_rows == 0 and covered - start < ADVANCE_EVERY:
                    return routed  # nothing to route; progress catches up with the next commit
                now = _clock_ms() if now_ms is None else now_ms
                planned, skipped = self._messages(failures, now, [p for p, _ in states])
                written, complete = self._commit(states, covered, planned, skipped, failures.num_rows > 0)
                routed += written
                if not complete:
                    continue  # another router committed from the same progress: read it again
                return routed
        raise CommitConflictError(
            f"retry routing lost {_MAX_LOST_RACES} races in a row", table=schemas.COMMIT_LOG
        )

    def _commit(
        self,
        states: list[tuple[int, int]],
        covered: int,
        planned: dict[int, list[PendingMessage]],
        skipped: list[dict[str, Any]],
        any_failures: bool,
    ) -> tuple[int, bool]:
        """Commit each shard's share of a routed range (with its progress): the re-puts written,
        and False when a shard's commit lost its race (shards committed before it keep theirs)."""
        written = 0
        for shard, (progress, seq) in enumerate(states):
            messages = planned.get(shard, [])
            if covered <= progress:
                continue
            if not messages and covered - progress < ADVANCE_EVERY and not (shard == 0 and any_failures):
                continue
            metadata = {RETRY_RANGE_KEY: f"{progress + 1}..{covered}"}
            if skipped and shard == 0:
                metadata[RETRY_SKIPPED_KEY] = json.dumps(skipped[:_MAX_SKIPPED_LISTED])
            stamped = self._writers.writer(shard).append(
                messages,
                app_transactions={RETRY_APP: covered, RETRY_GUARD_APP: seq + 1},
                custom_metadata=metadata,
            )
            if messages and not stamped:
                return written, False
            if stamped:
                written += len(stamped)
                dead = sum(1 for m in messages if m.topic != SCHEDULE_TOPIC)
                self.dead += dead
                self.retried += len(messages) - dead
                if shard == 0:
                    self.skipped += len(skipped)
        return written, True

    def _messages(
        self, failures: pa.Table, now: int, progress: list[int]
    ) -> tuple[dict[int, list[PendingMessage]], list[dict[str, Any]]]:
        """The re-puts of ``failures`` by target shard (leaving out what each shard's ``progress``
        already covers), and the rows skipped."""
        present = [c for c in ROUTE_COLUMNS if c in failures.column_names]
        rows = failures.select([*present, VERSION_COLUMN]).to_pylist()
        found = self._fetch([int(r["physical_offset"]) for r in rows])
        default = self._store.config.max_reconsume_times
        seen: set[tuple[str, int, int]] = set()
        messages: dict[int, list[PendingMessage]] = {}
        skipped: list[dict[str, Any]] = []
        for r in rows:  # in action-log order
            group, physical = str(r["group"]), int(r["physical_offset"])
            message = found.get(physical)
            reason = None
            if message is None:
                reason = "no message at this physical offset"
            elif r["msg_id"] and r["msg_id"] not in (message["msg_id"], message["uniq_key"]):
                # Consumers record the id they know the message by (MessageExt.msg_id, the unique
                # id; older rows: the offset id): either names the stored copy.
                reason = f"msg_id {r['msg_id']} does not match the stored {message['msg_id']}"
            elif int(message["sys_flag"]) in UNDISPATCHED_FLAGS:
                reason = "a transaction half message is never consumed"
            if reason is not None or message is None:
                skipped.append({"group": group, "physical_offset": physical, "reason": reason})
                continue
            # The row's count wins when higher: a SimpleConsumer redelivers from the original queue
            # (the stored copy still says 0) and a PushConsumer raises it to dead-letter early.
            times = max(int(message["reconsume_times"] or 0), int(r["reconsume_times"] or 0))
            failed = {**message, "reconsume_times": times}
            retry_at = r.get("deadline_ms") if r["action"] == NACK else None
            routed = route_message(
                failed, group, now, self._setting, default, None if retry_at is None else int(retry_at)
            )
            shard = self._writers.shard_of(routed.topic, routed.queue_id)
            if int(r[VERSION_COLUMN]) <= progress[shard] or (group, physical, shard) in seen:
                continue  # routed on that shard already; one route per (group, message) per range
            seen.add((group, physical, shard))
            self._ensure_topics(group, routed.topic == SCHEDULE_TOPIC)
            messages.setdefault(shard, []).append(routed)
        return messages, skipped

    def _states(self) -> list[tuple[int, int]]:
        """Per shard: (last action-log version routed, commit counter), from private snapshots."""
        states = []
        for shard, table in enumerate(self._store.commit_logs):
            dt = self._dts[shard] = self._store.caught_up(table, self._dts.get(shard))
            states.append((dt.app_version(RETRY_APP), dt.app_version(RETRY_GUARD_APP)))
        return states

    def _ensure_topics(self, group: str, retry: bool) -> None:
        """Create the schedule and retry topics (a retry) or the dead-letter topic on first use."""
        names = [SCHEDULE_TOPIC, retry_topic(group)] if retry else [dlq_topic(group)]
        for name in names:
            if name not in self._ensured:
                store = self._store
                if (
                    store.topic_configs().get(name) is None
                    and store.topic_configs(refresh=True).get(name) is None
                ):
                    store.put_topic(system_topic_config(name, _clock_ms()))
                self._ensured.add(name)

    def _fetch(self, physical: list[int]) -> dict[int, dict[str, Any]]:
        """Commit-log rows by physical offset; offsets with no readable row are left out."""
        wanted = sorted(set(physical))
        for _ in range(3):
            if not wanted:
                return {}
            try:
                table = self._index.messages(wanted)
            except StoreError as exc:
                gone = set(getattr(exc, "offsets", None) or ())
                if not gone:
                    raise
                wanted = [p for p in wanted if p not in gone]
                continue
            return {int(r["physical_offset"]): r for r in table.to_pylist()}
        raise StoreError("commit-log rows for retried messages keep disappearing", offsets=wanted)


def route_action_rows(
    store: Store,
    rows: pa.Table,
    *,
    max_reconsume_times: MaxReconsume = None,
    now_ms: int | None = None,
) -> int:
    """Route the NACK / EXPIRED rows among action-log ``rows`` (with ``_version``); see :class:`RetryRouter`.

    Idempotent per action-log version. Returns the messages re-put.
    """
    return RetryRouter(store, max_reconsume_times=max_reconsume_times).route(rows, now_ms)


def route_retries(
    store: Store,
    *,
    max_versions: int = 1000,
    max_reconsume_times: MaxReconsume = None,
    now_ms: int | None = None,
    router: RetryRouter | None = None,
) -> int:
    """Route every committed action-log failure not yet routed, without Spark; returns re-puts.

    The Spark retry job (``jobs/retry.py``) is the production path; this is the same logic for
    tools and tests. Exactly once: a second call routes nothing new.

    Args:
        store: the store.
        max_versions: action-log versions read per commit.
        max_reconsume_times: see :class:`RetryRouter` (ignored when ``router`` is given).
        now_ms: the clock, for retry due times (default now).
        router: a router to reuse.

    Raises:
        InvalidArgumentError: bad ``max_versions`` or ``max_reconsume_times``.
        StoreError, CommitConflictError: as :meth:`RetryRouter.route`.
    """
    if isinstance(max_versions, bool) or not isinstance(max_versions, int) or max_versions < 1:
        raise InvalidArgumentError(
            f"max_versions {max_versions!r} must be an int >= 1", max_versions=max_versions
        )
    router = router or RetryRouter(store, max_reconsume_times=max_reconsume_times)
    chunks = store.versions_after(schemas.ACTION_LOG, routed_version(store), max_versions=max_versions)
    return sum(router.route(rows, now_ms) for rows, _ in chunks)
