"""Every ``mq.*`` marker the engine keeps in Delta commits, in one registry.

Two kinds, both part of the commit that makes data visible, so they can never disagree with it:

- commitInfo keys (``custom_metadata``): the state of a table as of a commit (the commit log's
  high-water marks, the consume queue's per-queue bounds, …) or facts about that one commit.
- Delta app transactions (``txn`` actions): the last version of a source a job has covered, and the
  one-shot guards of transaction decisions. A writer checks them before committing, which makes a
  replayed micro-batch or a second instance a no-op.

A state marker is read from the newest commit that carries it; maintenance commits (compaction,
retention) carry the ``carried`` ones forward, so the marker outlives the cleanup of older commit
files. A per-commit key (such as the sequencer's batch id) must never be carried.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from engine.store import schemas

# ----------------------------------------------------------------------------- commitInfo keys
HWM_KEY = "mq.hwm"
"""commit_log: the full high-water marks after the commit (next physical offset, last store time, next
offset of every queue): on the creation commit, maintenance commits and stores of older versions."""
MARKS_KEY = "mq.marks"
"""commit_log: the compact marks of a sequenced append (see :mod:`engine.store.commit_log.marks`): the next
physical offset, the queues written and a rolling slice of the others; never carried."""
BATCH_KEY = "mq.batch"
"""commit_log: the id of the producer batch a commit holds, ``<writer>-<batch>`` (finds an append of
unknown outcome; racing writers count their rivals by the writer part)."""
COMMIT_ID_KEY = "mq.commit"
"""every table: a fresh id of each commit made through delta-rs
(:func:`engine.store.delta.commits.commit_next`): a commit whose answer was lost (an object store's
5xx or timeout, then its retry meets "version already exists") is recognised as this writer's by it."""
CQ_KEY = "mq.cq"
"""consume_queue: every queue's next and minimum retained offset, and the covered commit-log version."""
PULL_LOG_MARKS_KEY = "mq.pl"
"""pull_log: every consumer's next pull sequence."""
GROUPS_STATE_KEY = "mq.groups"
"""groups: members, heartbeats and queue leases as of the commit."""
SCHEDULE_STATE_KEY = "mq.schedule"
"""commit_log: the schedule job's state counter and its timer runs (on a sharded store: the timer
queue's shard holds the state, every other shard its own copy guarding deliveries to it)."""
SCHEDULE_DROPPED_KEY = "mq.schedule.dropped"
"""commit_log: schedule messages dropped by a delivery commit (their real topic is gone)."""
RETRY_RANGE_KEY = "mq.retry.range"
"""commit_log: the action-log version range a retry commit routed."""
RETRY_SKIPPED_KEY = "mq.retry.skipped"
"""commit_log: failure rows a retry commit skipped, with the reason."""
TX_FLOOR_KEY = "mq.tx.floor"
"""transactions: the oldest half offset the check-back still looks at."""
COUNTS_KEY = "mq.counts"
"""any table: the actions of a commit the engine knows before delta-rs writes it (``{"txn": n}``; for a
commit of ready actions also ``add`` and ``remove``): a commit file cut at a line break is caught by
the count (delta-rs's ``operationMetrics`` count the files a write adds)."""
MAINTENANCE_KEY = "mq.maintenance"
"""any table: the maintenance operation of a commit (``compact``, ``retain``)."""

# ----------------------------------------------------------------------------- app transaction ids
DISPATCH_APP = "mq.dispatch"
"""consume_queue: last commit-log version dispatched (of shard 0; shard k: :func:`dispatch_app`)."""
INDEX_APP = "mq.index"
"""index: last commit-log version indexed (of shard 0; shard k: :func:`index_app`)."""
PULL_LOG_APP = "mq.pull_log"
"""pull_log: last action-log version whose PULL rows are in the pull log."""
RETRY_APP = "mq.retry"
"""commit_log: last action-log version whose failures are routed (per shard on a sharded store:
the re-puts bound for that shard)."""
RETRY_GUARD_APP = "mq.retry.seq"
"""commit_log: the retry router's commit counter (two routers never commit the same plan), per shard."""
SCHEDULE_APP = "mq.schedule"
"""commit_log: the schedule job's commit counter; ``mq.schedule.<queue>`` its per-queue progress (each
shard keeps its own, see :mod:`engine.broker.schedule_shards`)."""
EXPIRING_APP_PREFIX = TX_APP_PREFIX = "mq.tx."
"""commit_log: ``mq.tx.<half offset>`` guards the decision on one transaction half (on the shard of the
half's real queue, where the decision is written). The only app ids
that expire (they carry ``lastUpdated``; the table's transaction retention drops them): every other
app id is a progress marker, and an expired one would read as "nothing done yet"."""
LEASE_APP_PREFIX = "mq.lease."
"""action_log: ``mq.lease.<group>/<topic>/<queue>`` = the group's lease frontier in that queue (the next
offset never leased). Every commit that decides about leases of the queue carries it, so Delta's
conflict check serialises those commits per queue while acks and other queues' leases rebase freely."""
SINK_APP_PREFIX = "mq.sink."
"""commit_log: ``mq.sink.<id>`` the last micro-batch a Spark ``mq`` sink committed."""


def dispatch_app(shard: int = 0) -> str:
    """App id recording the last version of commit-log shard ``shard`` dispatched
    (:data:`DISPATCH_APP` for shard 0, so a store of one shard keeps its id; ``mq.dispatch.<k>``)."""
    return DISPATCH_APP if shard == 0 else f"{DISPATCH_APP}.{shard}"


def index_app(shard: int = 0) -> str:
    """App id recording the last version of commit-log shard ``shard`` indexed (:data:`INDEX_APP`
    for shard 0; ``mq.index.<k>``)."""
    return INDEX_APP if shard == 0 else f"{INDEX_APP}.{shard}"


def schedule_queue_app(queue_id: int) -> str:
    """App id recording the progress of one schedule queue."""
    return f"{SCHEDULE_APP}.{queue_id}"


def transaction_app(half_physical_offset: int) -> str:
    """App id guarding the decision on one transaction half."""
    return f"{TX_APP_PREFIX}{half_physical_offset}"


def lease_app(group: str, topic: str, queue_id: int) -> str:
    """App id of a group's lease frontier in one queue (group and topic names hold no ``/``)."""
    return f"{LEASE_APP_PREFIX}{group}/{topic}/{queue_id}"


def sink_app(sink_id: str) -> str:
    """App id of a Spark ``mq`` sink's progress."""
    return f"{SINK_APP_PREFIX}{sink_id}"


@dataclass(frozen=True)
class Marker:
    """One registered marker: where it lives, who writes it, whether maintenance carries it."""

    key: str
    kind: Literal["commit_info", "app_transaction"]
    table: str
    writer: str
    carried: bool = False


MARKERS: tuple[Marker, ...] = (
    Marker(HWM_KEY, "commit_info", schemas.COMMIT_LOG, "producers (the sequencer)", carried=True),
    Marker(MARKS_KEY, "commit_info", schemas.COMMIT_LOG, "producers (the sequencer)"),
    Marker(BATCH_KEY, "commit_info", schemas.COMMIT_LOG, "producers (the sequencer)"),
    Marker(SCHEDULE_STATE_KEY, "commit_info", schemas.COMMIT_LOG, "the schedule job"),
    Marker(SCHEDULE_DROPPED_KEY, "commit_info", schemas.COMMIT_LOG, "the schedule job"),
    Marker(RETRY_RANGE_KEY, "commit_info", schemas.COMMIT_LOG, "the retry job"),
    Marker(RETRY_SKIPPED_KEY, "commit_info", schemas.COMMIT_LOG, "the retry job"),
    Marker(CQ_KEY, "commit_info", schemas.CONSUME_QUEUE, "the dispatch job", carried=True),
    Marker(PULL_LOG_MARKS_KEY, "commit_info", schemas.PULL_LOG, "the pull-log job", carried=True),
    Marker(GROUPS_STATE_KEY, "commit_info", schemas.GROUPS, "consumers (membership, queue locks)"),
    Marker(TX_FLOOR_KEY, "commit_info", schemas.TRANSACTIONS, "the transaction check job"),
    Marker(MAINTENANCE_KEY, "commit_info", "*", "the maintenance job"),
    Marker(COMMIT_ID_KEY, "commit_info", "*", "every engine commit through delta-rs (commit_next)"),
    Marker(COUNTS_KEY, "commit_info", "*", "every engine commit (engine.store.delta.commits.commit_next)"),
    Marker(DISPATCH_APP, "app_transaction", schemas.CONSUME_QUEUE, "the dispatch job"),
    Marker(INDEX_APP, "app_transaction", schemas.INDEX, "the index job"),
    Marker(PULL_LOG_APP, "app_transaction", schemas.PULL_LOG, "the pull-log job"),
    Marker(RETRY_APP, "app_transaction", schemas.COMMIT_LOG, "the retry job"),
    Marker(RETRY_GUARD_APP, "app_transaction", schemas.COMMIT_LOG, "the retry job"),
    Marker(SCHEDULE_APP, "app_transaction", schemas.COMMIT_LOG, "the schedule job"),
    Marker(TX_APP_PREFIX, "app_transaction", schemas.COMMIT_LOG, "transaction producers and the check job"),
    Marker(SINK_APP_PREFIX, "app_transaction", schemas.COMMIT_LOG, "Spark mq sinks"),
    Marker(LEASE_APP_PREFIX, "app_transaction", schemas.ACTION_LOG, "SimpleConsumers (leases)"),
)


def carried_markers(table: str) -> tuple[str, ...]:
    """The commitInfo keys maintenance commits on ``table`` carry forward (every commit-log shard
    carries the commit log's)."""
    kind = schemas.COMMIT_LOG if schemas.shard_of_table(table) is not None else table
    return tuple(m.key for m in MARKERS if m.carried and m.table == kind)
