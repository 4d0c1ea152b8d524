"""The Delta kernel: the only code of the engine that imports ``deltalake``.

Everything the rest of the store does to a Delta table goes through the names below, and no
delta-rs object leaves this package: callers hold a :class:`Snapshot` (a delta-rs handle that only
its owner moves) and see Arrow tables, plain values and the engine's errors.

- handles and their renewal (:mod:`.snapshot`): open, create, refresh, app transactions, commit
  markers, live files, checkpoints, vacuum;
- reading the log version by version (:mod:`.log`): the feed of every streaming broker job;
- committing exactly the next version and its outcomes (:mod:`.commits`): :func:`commit_next`,
  checkpoints at the interval, the look-up of a write whose outcome was unknown;
- direct appends (:mod:`.direct_append`, :mod:`.blind_appends`, :mod:`.followed_log`): commit files
  written by the engine itself on a local store, where delta-rs costs more than the commit;
- data files (:mod:`.data_files`, :mod:`.file_reader`): written with Delta's statistics, read by
  point reads on the pull path; those a process writes kept for its readers and fed to another
  process of the host (:mod:`.file_feed`);
- the store's side files, whole objects put, got, listed and deleted (:mod:`.objects`);
- repair of a log torn by a crash (:mod:`.repair`), durability (:mod:`.durability`), the host lock
  (:mod:`.hostlock`).
"""

from __future__ import annotations

from engine.store.delta.blind_appends import BlindAppends
from engine.store.delta.commits import (
    NO_HOOKS,
    background_checkpoints,
    backoff,
    checkpoint_if_due,
    commit_next,
    failed_link_landed,
    find_batch,
    landed,
    writer_properties,
)
from engine.store.delta.data_files import (
    StatsColumns,
    delete_files,
    read_columns,
    read_file,
    remove_action,
    rewrite_files,
    stats_range,
    write_file,
)
from engine.store.delta.direct_append import (
    STALE_LOOK_S,
    DirectAppender,
    LogCommit,
    direct_append_enabled,
    direct_appender,
)
from engine.store.delta.durability import fsync_version
from engine.store.delta.file_feed import FileFeed, FileIntake, feed_pair
from engine.store.delta.file_reader import FileReader, FileStats
from engine.store.delta.followed_log import FollowedLog, follow_log
from engine.store.delta.hostlock import LOCK_DIR, LOCK_WAIT_S, HostLock, host_lock_enabled
from engine.store.delta.log import (
    VERSION_COLUMN,
    earliest_version,
    probe_latest_version,
    read_files,
    read_version,
    read_versions,
    table_filesystem,
)
from engine.store.delta.objects import (
    ObjectInfo,
    delete_object,
    delete_prefix,
    get_object,
    list_objects,
    local_path,
    object_exists,
    put_object,
)
from engine.store.delta.repair import commit_parses, repair_log
from engine.store.delta.rewrite_commit import commit_following
from engine.store.delta.snapshot import (
    MAX_WALK_BACK,
    RENEW_HANDLE_COMMITS,
    Action,
    DataFile,
    Snapshot,
    app_transactions,
    checkpoint_interval,
    create_table,
    data_files_of,
    int_column,
    listing_gap,
    log_gone,
    open_snapshot,
    str_column,
)

__all__ = [
    "LOCK_DIR",
    "LOCK_WAIT_S",
    "MAX_WALK_BACK",
    "NO_HOOKS",
    "RENEW_HANDLE_COMMITS",
    "STALE_LOOK_S",
    "VERSION_COLUMN",
    "Action",
    "BlindAppends",
    "DataFile",
    "DirectAppender",
    "FileFeed",
    "FileIntake",
    "FileReader",
    "FileStats",
    "FollowedLog",
    "HostLock",
    "LogCommit",
    "ObjectInfo",
    "Snapshot",
    "StatsColumns",
    "app_transactions",
    "background_checkpoints",
    "backoff",
    "checkpoint_if_due",
    "checkpoint_interval",
    "commit_following",
    "commit_next",
    "commit_parses",
    "create_table",
    "data_files_of",
    "delete_files",
    "delete_object",
    "delete_prefix",
    "direct_append_enabled",
    "direct_appender",
    "earliest_version",
    "failed_link_landed",
    "feed_pair",
    "find_batch",
    "follow_log",
    "fsync_version",
    "get_object",
    "host_lock_enabled",
    "int_column",
    "landed",
    "list_objects",
    "listing_gap",
    "local_path",
    "log_gone",
    "object_exists",
    "open_snapshot",
    "probe_latest_version",
    "put_object",
    "read_columns",
    "read_file",
    "read_files",
    "read_version",
    "read_versions",
    "remove_action",
    "repair_log",
    "rewrite_files",
    "stats_range",
    "str_column",
    "table_filesystem",
    "write_file",
    "writer_properties",
]
