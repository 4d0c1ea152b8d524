"""The store's tables: their names and fixed schemas (the catalog :class:`engine.store.Store` creates).

Each table's reads and writes live in its own module (``commit_log``, ``consume_queue``, ``index``, …);
the schemas stay together here so that opening a store creates every table without importing them.
"""

from __future__ import annotations

import pyarrow as pa

COMMIT_LOG = "commit_log"
CONSUME_QUEUE = "consume_queue"
INDEX = "index"
CONSUMER_OFFSET = "consumer_offset"
ACTION_LOG = "action_log"
PULL_LOG = "pull_log"
TOPICS = "topics"
GROUPS = "groups"
TRANSACTIONS = "transactions"
OFFSET_RESETS = "offset_resets"
GROUP_CONFIGS = "group_configs"
# Table property of shard 0's commit log: how many commit logs the store keeps (absent: 1).
SHARDS_PROPERTY = "lakemq.commitLogShards"

_str = pa.string()
_i32 = pa.int32()
_i64 = pa.int64()

COMMIT_LOG_SCHEMA = pa.schema(
    [
        pa.field("physical_offset", _i64, nullable=False),
        pa.field("topic", _str, nullable=False),
        pa.field("queue_id", _i32, nullable=False),
        pa.field("queue_offset", _i64, nullable=False),
        pa.field("msg_id", _str, nullable=False),
        pa.field("uniq_key", _str, nullable=False),
        pa.field("tags", _str),
        pa.field("tags_code", _i64, nullable=False),
        pa.field("keys", pa.list_(_str)),
        pa.field("properties", pa.map_(_str, _str)),
        pa.field("body", pa.binary(), nullable=False),
        pa.field("size", _i32, nullable=False),
        pa.field("born_ts_ms", _i64, nullable=False),
        pa.field("store_ts_ms", _i64, nullable=False),
        pa.field("sys_flag", _i32, nullable=False),
        pa.field("delay_level", _i32, nullable=False),
        pa.field("deliver_at_ms", _i64),
        pa.field("reconsume_times", _i32, nullable=False),
    ]
)

CONSUME_QUEUE_SCHEMA = pa.schema(
    [
        pa.field("topic", _str, nullable=False),
        pa.field("queue_id", _i32, nullable=False),
        pa.field("queue_offset", _i64, nullable=False),
        pa.field("physical_offset", _i64, nullable=False),
        pa.field("size", _i32, nullable=False),
        pa.field("tags_code", _i64, nullable=False),
        pa.field("store_ts_ms", _i64, nullable=False),
        # commit_log version the entry was dispatched from: the dispatch job's resume point.
        pa.field("log_version", _i64, nullable=False),
    ]
)

INDEX_SCHEMA = pa.schema(
    [
        pa.field("topic", _str, nullable=False),
        pa.field("kind", _str, nullable=False),  # KEY or UNIQ_KEY
        pa.field("key", _str, nullable=False),
        pa.field("physical_offset", _i64, nullable=False),
        pa.field("queue_id", _i32, nullable=False),
        pa.field("queue_offset", _i64, nullable=False),
        pa.field("store_ts_ms", _i64, nullable=False),
        pa.field("log_version", _i64, nullable=False),
    ]
)

CONSUMER_OFFSET_SCHEMA = pa.schema(
    [
        pa.field("group", _str, nullable=False),
        pa.field("topic", _str, nullable=False),
        pa.field("queue_id", _i32, nullable=False),
        pa.field("offset", _i64, nullable=False),
        pa.field("ts_ms", _i64, nullable=False),
        # Empty for clustering groups; the instance id for broadcasting consumers.
        pa.field("consumer_id", _str, nullable=False),
    ]
)

ACTION_LOG_SCHEMA = pa.schema(
    [
        pa.field("group", _str, nullable=False),
        pa.field("consumer_id", _str, nullable=False),
        pa.field("sequence", _i64, nullable=False),
        pa.field("action", _str, nullable=False),  # engine.protocol.actions
        pa.field("topic", _str, nullable=False),
        pa.field("queue_id", _i32, nullable=False),
        pa.field("queue_offset", _i64, nullable=False),
        pa.field("physical_offset", _i64, nullable=False),
        pa.field("msg_id", _str),
        pa.field("reconsume_times", _i32, nullable=False),
        pa.field("deadline_ms", _i64),
        pa.field("ts_ms", _i64, nullable=False),
        # PULL, ACK and RELEASE rows cover the queue offsets [queue_offset, end_offset); null: one
        # offset. Last, so a store created before it gains it by schema evolution (Store.open).
        pa.field("end_offset", _i64),
    ]
)

PULL_LOG_SCHEMA = pa.schema(
    [
        pa.field("group", _str, nullable=False),
        pa.field("consumer_id", _str, nullable=False),
        pa.field("pull_sequence", _i64, nullable=False),
        pa.field("topic", _str, nullable=False),
        pa.field("queue_id", _i32, nullable=False),
        pa.field("queue_offset", _i64, nullable=False),
        pa.field("physical_offset", _i64, nullable=False),
        pa.field("ts_ms", _i64, nullable=False),
    ]
)

TOPICS_SCHEMA = pa.schema(
    [
        pa.field("name", _str, nullable=False),
        pa.field("queues", _i32, nullable=False),
        pa.field("perm", _i32, nullable=False),
        pa.field("type", _str, nullable=False),
        pa.field("created_ts_ms", _i64, nullable=False),
    ]
)

GROUPS_SCHEMA = pa.schema(
    [
        pa.field("group", _str, nullable=False),
        pa.field("consumer_id", _str, nullable=False),
        pa.field("event", _str, nullable=False),  # HEARTBEAT, LEAVE, LOCK, UNLOCK
        pa.field("model", _str, nullable=False),
        pa.field("subscriptions", _str),  # JSON: topic -> expression
        pa.field("topic", _str),
        pa.field("queue_id", _i32),
        pa.field("ts_ms", _i64, nullable=False),
        pa.field("expire_ms", _i64),
    ]
)

# Transaction bookkeeping, append-only: CHECK requests from the check job (answered by the producer
# group's check-back thread) and the decisions taken (COMMIT / ROLLBACK, informational: the decision
# of record is the commit log's ``mq.tx.<half_physical_offset>`` app transaction).
TRANSACTIONS_SCHEMA = pa.schema(
    [
        pa.field("half_physical_offset", _i64, nullable=False),
        pa.field("half_msg_id", _str, nullable=False),
        pa.field("uniq_key", _str, nullable=False),
        pa.field("producer_group", _str, nullable=False),
        pa.field("topic", _str, nullable=False),  # the real topic
        pa.field("queue_id", _i32, nullable=False),  # the real queue
        pa.field("event", _str, nullable=False),  # CHECK, COMMIT, ROLLBACK
        pa.field("check_times", _i32, nullable=False),
        pa.field("physical_offset", _i64),  # the committed message (COMMIT only)
        pa.field("queue_offset", _i64),
        pa.field("reason", _str),  # LOCAL, CHECK, MAX_CHECKS
        pa.field("ts_ms", _i64, nullable=False),
    ]
)

# Offset resets of a group (Admin.reset_offset / reset_offset_by_time), append-only: running
# consumers watch it to drop what they hold of a reset queue and resume from the new offset.
OFFSET_RESETS_SCHEMA = pa.schema(
    [
        pa.field("group", _str, nullable=False),
        pa.field("topic", _str, nullable=False),
        pa.field("queue_id", _i32, nullable=False),
        pa.field("offset", _i64, nullable=False),
        pa.field("ts_ms", _i64, nullable=False),  # when the reset was made: newer resets win
    ]
)

# Settings of consumer groups (Admin.update_group, mq group set), append-only: the newest row of a
# group is its setting; a group with no row has the defaults.
GROUP_CONFIGS_SCHEMA = pa.schema(
    [
        pa.field("group", _str, nullable=False),
        # RocketMQ's consumeMessageOrderly, RocketMQ 5's FIFO consume type (the 5.x "fifo" flag).
        pa.field("fifo", pa.bool_(), nullable=False),
        pa.field("ts_ms", _i64, nullable=False),
    ]
)

SCHEMAS: dict[str, pa.Schema] = {
    COMMIT_LOG: COMMIT_LOG_SCHEMA,
    CONSUME_QUEUE: CONSUME_QUEUE_SCHEMA,
    INDEX: INDEX_SCHEMA,
    CONSUMER_OFFSET: CONSUMER_OFFSET_SCHEMA,
    ACTION_LOG: ACTION_LOG_SCHEMA,
    PULL_LOG: PULL_LOG_SCHEMA,
    TOPICS: TOPICS_SCHEMA,
    GROUPS: GROUPS_SCHEMA,
    TRANSACTIONS: TRANSACTIONS_SCHEMA,
    OFFSET_RESETS: OFFSET_RESETS_SCHEMA,
    GROUP_CONFIGS: GROUP_CONFIGS_SCHEMA,
}


def commit_log_table(shard: int) -> str:
    """The table name of commit-log shard ``shard``: ``commit_log`` for shard 0 (a store without
    shards is a store of one), ``commit_log_<shard>`` for the others."""
    return COMMIT_LOG if shard == 0 else f"{COMMIT_LOG}_{shard}"


def shard_of_table(name: str) -> int | None:
    """The shard a commit-log table name holds, or None when ``name`` is no commit-log table."""
    if name == COMMIT_LOG:
        return 0
    prefix = f"{COMMIT_LOG}_"
    if name.startswith(prefix) and name[len(prefix) :].isdigit() and not name[len(prefix) :].startswith("0"):
        return int(name[len(prefix) :])
    return None


def kind_of(name: str) -> str:
    """The catalog name of a table: ``commit_log`` for every shard's commit log, else ``name``.

    Raises:
        KeyError: ``name`` is no table of a store.
    """
    if shard_of_table(name) is not None:
        return COMMIT_LOG
    if name not in SCHEMAS:
        raise KeyError(name)
    return name


def schema_of(name: str) -> pa.Schema:
    """The fixed schema of a table, every commit-log shard included.

    Raises:
        KeyError: ``name`` is no table of a store.
    """
    return SCHEMAS[kind_of(name)]
