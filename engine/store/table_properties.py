"""The Delta table properties of a store's tables: what each table is created with, and what a
store created before a property existed is given when it is opened."""

from __future__ import annotations

from engine.config import EngineConfig
from engine.store import schemas

# Columns that carry data-skipping statistics. Bodies and maps are left out: their stats cost log
# space and prune nothing.
_STATS_COLUMNS: dict[str, int] = {
    schemas.COMMIT_LOG: 8,
    schemas.CONSUME_QUEUE: 8,
    schemas.INDEX: 8,
}


# App transactions on the commit log that carry ``lastUpdated`` (the sequencer stamps it on one-shot
# guards only, see :data:`engine.store.commit_markers.EXPIRING_APP_PREFIX`) are dropped by Delta readers and
# checkpoints after this long, so the snapshot does not grow by one per transaction forever.
TXN_RETENTION = "interval 7 days"
# Table properties set at creation, and added to existing tables that lack them when a store opens.
# The commit log's statistics: the first 8 columns (identity and tags) and the two times, so that a
# reader skips files by topic, queue, offsets and store time (delta-spark, DuckDB, delta-rs); not
# the keys, properties and bodies, whose statistics would cost log space and prune nothing.
COMMIT_LOG_STATS_COLUMNS = (
    *schemas.COMMIT_LOG_SCHEMA.names[: _STATS_COLUMNS[schemas.COMMIT_LOG]],
    "born_ts_ms",
    "store_ts_ms",
)
LOG_RETENTION_KEY = "delta.logRetentionDuration"


def log_retention(config: EngineConfig) -> str:
    """The ``delta.logRetentionDuration`` every table of a store gets: ``config.log_retention_minutes``.

    Set when a table is created; the maintenance job applies a changed setting to existing tables
    (:func:`engine.store.maintenance.apply_log_retention`), so that processes opening one store with
    different settings do not take turns rewriting it.
    """
    return f"interval {config.log_retention_minutes} minutes"


# Every table checkpoints at Delta's own default interval (delta-rs uses 100 where a table does not
# say): delta-rs refreshes a handle, and commits through one, by replaying every commit since the
# last checkpoint, so each costs about 0.15 ms more per commit since it. Measured with a 1,001-file
# table on the bench machine, a refresh by one version took 12.4 ms at interval 100 and 5.4 ms at 10,
# an append 19.0 ms and 11.7 ms, against 1.7 ms per commit for writing the checkpoints. Writers catch
# up after every commit of a rival and readers refresh on every poll, so the shorter interval pays.
CHECKPOINT_INTERVAL = "10"
_EVERY_TABLE = {"delta.checkpointInterval": CHECKPOINT_INTERVAL}
# Except the commit log (every shard): its writers append directly and follow the log by reading
# commit files (engine.store.delta.direct_append), so checkpoints no longer speed them up, while each one
# costs its writer about 30 ms of delta-rs (loading the version, then writing it), a fixed cost
# whatever the interval: at 10 that is 3 ms per commit, a third of a one-message send. Its readers
# refresh once per broker micro-batch, not per message. Measured with bench/contention.py, 8 writers
# without the host lock, medians of 3 runs: 4 shards 147 msg/s at 10, 178 at 100.
COMMIT_LOG_CHECKPOINT_INTERVAL = "100"

_TABLE_PROPERTIES: dict[str, dict[str, str]] = {
    schemas.COMMIT_LOG: {
        "delta.checkpointInterval": COMMIT_LOG_CHECKPOINT_INTERVAL,
        "delta.setTransactionRetentionDuration": TXN_RETENTION,
        "delta.dataSkippingStatsColumns": ",".join(COMMIT_LOG_STATS_COLUMNS),
    },
}


def table_properties(kind: str) -> dict[str, str]:
    """The Delta table properties a table of ``kind`` is created with (and given, if missing, when
    a store created before them is opened)."""
    return {**_EVERY_TABLE, **_TABLE_PROPERTIES.get(kind, {})}


def creation_properties(kind: str, config: EngineConfig) -> dict[str, str | None]:
    """Every property a new table of ``kind`` is created with in a store configured by ``config``:
    its statistics columns, :func:`table_properties` and the log retention."""
    configuration: dict[str, str | None] = {}
    if kind in _STATS_COLUMNS:
        configuration["delta.dataSkippingNumIndexedCols"] = str(_STATS_COLUMNS[kind])
    configuration.update(table_properties(kind))
    configuration[LOG_RETENTION_KEY] = log_retention(config)
    return configuration
