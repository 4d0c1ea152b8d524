"""Optimistic sequencing of the commit log on the Delta log itself.

Every commit to ``commit_log`` carries, in its commitInfo, the high-water marks after it: the next
physical offset, the last store time and the next offsets of the queues it wrote, plus a rolling
slice of the others (``mq.marks``; the form and how the marks are rebuilt from it are in
:mod:`engine.store.commit_log.marks`), so commit metadata does not grow with the number of topics. A writer
stamps its batch from the marks of the version it read, then commits exactly the next version with
automatic retries disabled. If another writer took that version, it applies the commits it missed
to its marks and stamps again. The Delta log is the lock: no offset is assigned twice and queue
offsets stay dense, however many processes append.

On a local store, writers of one host also queue on an advisory lock (``flock`` on
``<store>/_locks/commit_log.lock``) held from catch-up to commit, so they take turns instead of
racing. The lock is only an optimization: the optimistic protocol above stays the correctness
mechanism (writers on other hosts or object stores and ``MQ_SEQUENCER_LOCK=0`` race and retry;
maintenance commits on the commit log take their turn on the lock too). A stopped holder delays
the others at most ``LOCK_WAIT_S`` (:mod:`engine.store.delta.hostlock`).

Without the lock, racing writers are paced so that they take turns (:mod:`engine.store.commit_log.pacing`):
a loser first waits (a jittered pause of about one commit time per rival writer, halved for every
further race it lost in a row) and only then catches up, so it stamps from the newest version
instead of from one already stale after the pause; a writer that wins while the race is hot holds
its next append back by about one commit time per rival. Rivals are counted from the commits a
writer missed: each batch id is ``<writer>-<batch>``. ``max_commit_attempts`` lost races in a row
raise the retryable :class:`CommitConflictError`.

A lost race rewrites the batch's data file: the offsets are columns of the rows (``physical_offset``,
``queue_offset``, ``store_ts_ms`` and the ``msg_id`` made from the physical offset; the table is
self-describing and compaction-safe), so there is no cheaper re-stamp that keeps files readable by
any Delta reader.

On a local store and on S3 a batch without app transactions is committed by the writer itself
(:mod:`engine.store.delta.direct_append`: pyarrow writes the file, the commit file is put at the next
version with put-if-absent: a hard link, or a PUT with ``If-None-Match: *``), and a writer catches up
by reading the commit files it missed: about 2.5 ms per one-message append against 12 ms through
delta-rs on a local disk, and on S3 two requests (the data file, the commit) against delta-rs's
listing and reads before its commit. The delta-rs handle is then kept only for what needs it (app
transactions, checkpoints, other object stores; ``MQ_DIRECT_APPEND=0`` sends everything through it).
Through delta-rs an append's cost grows with the table's live files and with the versions the
handle has moved on by since it was opened, so the writer reopens an aged handle
(:attr:`~engine.store.delta.Snapshot.aged`).
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
import uuid
from collections.abc import Mapping, Sequence

from engine.config import SYNC_FLUSH
from engine.errors import (
    CommitConflictError,
    CommitStateUnknownError,
    CommitTruncatedError,
    InvalidArgumentError,
    StoreError,
)
from engine.protocol.shards import shard_of_queue
from engine.store import schemas
from engine.store.commit_log.hwm import checkpoint_commit_log, read_hwm
from engine.store.commit_log.marks import HighWaterMarks, covering, replay
from engine.store.commit_log.pacing import RacePacer
from engine.store.commit_log.stamping import (
    NOTHING,
    PendingBatch,
    PendingMessage,
    Stamped,
    StampedBatch,
    stamp,
)
from engine.store.commit_markers import BATCH_KEY, EXPIRING_APP_PREFIX, HWM_KEY, MARKS_KEY
from engine.store.delta import (
    LOCK_DIR,
    LOCK_WAIT_S,
    NO_HOOKS,
    RENEW_HANDLE_COMMITS,
    STALE_LOOK_S,
    DirectAppender,
    HostLock,
    LogCommit,
    Snapshot,
    background_checkpoints,
    checkpoint_if_due,
    checkpoint_interval,
    commit_next,
    direct_append_enabled,
    direct_appender,
    failed_link_landed,
    find_batch,
    fsync_version,
    host_lock_enabled,
    landed,
    writer_properties,
)
from engine.store.delta import (
    app_transactions as delta_transactions,
)
from engine.store.store import Store, now_ms


def _writer_of(batch: object) -> str:
    """The writer id prefixing a commit's batch id ("" for commits of other kinds)."""
    return batch.split("-", 1)[0] if isinstance(batch, str) and "-" in batch else ""


# Small row groups let a pull read a few hundred rows instead of a whole micro-batch file.
COMMIT_LOG_ROW_GROUP_ROWS = 256
# Bodies are never filtered on and rarely repeat: no dictionary attempt and no page statistics for
# them (both cost CPU on every write and buy nothing).
_PLAIN_COLUMNS = ("body",)
_WRITER_PROPERTIES = writer_properties(COMMIT_LOG_ROW_GROUP_ROWS, _PLAIN_COLUMNS)
# A checkpoint of the commit log costs about 100 ms of CPU (a handle opened at its version, every live
# file's add written), whatever the rate of commits; at hundreds of commits a second its interval
# alone would spend a third of a core on it. A checkpoint that comes due sooner after the previous
# one began than that one's duration over this share is left out: the checkpoint thread spends at
# most about this share of its time on the commit log, and the next interval (or maintenance)
# takes one. A checkpoint only speeds up loading the table (Delta readers replay the commits after
# the last one; those of a busy writer come a few intervals apart). At a tenth, `mq serve` under
# synchronous wire sends (about 150 commits a second, each checkpoint slower as the table's files
# add up between compactions) still spent 0.2 ms of CPU per send on them, in delta-rs's threads:
# at 0.03 its CPU per send fell by 10-13 % (3 paired runs of the Java client, 2026-12-01). A
# checkpoint's delta-rs work runs on several threads at once, so its share of the CPU is a few
# times its share of the thread's time: at 0.01 `mq serve` under batched wire sends spent 29 us of
# CPU per message instead of 33-35 and took 35,400-35,800 in place of 33,000-33,400 a second (3
# paired runs, 2026-12-01).
CHECKPOINT_SHARE = 0.01
# A writer that fell behind by at most this many versions applies them to its marks one by one;
# further behind, it rebuilds the marks (a walk back of about as many commit files).
REPLAY_COMMITS = 256


def writers_host_lock(
    store: Store, table: str, *, enabled: bool | None = None, wait_s: float = LOCK_WAIT_S
) -> HostLock | None:
    """The lock the commit-log writers of this host take turns on for ``table`` (a commit-log
    shard), or None where there is none: an object store, or the lock turned off (``enabled``,
    default ``MQ_SEQUENCER_LOCK``). Maintenance commits on the commit log queue on it too
    (:func:`engine.store.maintenance.commit_planned`): racing a steady producer, they would lose.
    """
    use_lock = host_lock_enabled() if enabled is None else enabled
    if not use_lock or not store.is_local:
        return None
    return HostLock(os.path.join(store.root, LOCK_DIR, f"{table}.lock"), wait_s)


class CommitLogWriter:
    """Appends batches to one commit-log shard with sequenced offsets; one per process and shard is
    enough.

    Thread-safe: batches from several threads are committed one after another. On a local store,
    writers of the host take turns on :class:`HostLock` (see the module docstring), and batches
    without app transactions are committed directly (:mod:`engine.store.delta.direct_append`) when the
    table allows it.

    Args:
        store: the store to append to.
        host_lock: take the inter-process lock around each append (local stores only); default
            ``MQ_SEQUENCER_LOCK`` (on unless ``0``).
        lock_wait_s: longest wait for the lock before an append goes ahead without it.
        shard: the commit-log shard appended to (:mod:`engine.protocol.shards`); default 0, the
            only one of a store without shards.
        direct: commit appends without delta-rs where the table allows it; default
            ``MQ_DIRECT_APPEND`` (on unless ``0``).

    Raises:
        InvalidArgumentError: ``shard`` is not one of the store's shards.
    """

    def __init__(
        self,
        store: Store,
        *,
        host_lock: bool | None = None,
        lock_wait_s: float = LOCK_WAIT_S,
        shard: int = 0,
        direct: bool | None = None,
    ) -> None:
        if isinstance(shard, bool) or not isinstance(shard, int) or not 0 <= shard < store.commit_log_shards:
            raise InvalidArgumentError(
                f"shard {shard!r} is not a commit-log shard of {store.root} "
                f"({store.commit_log_shards} shard(s))",
                shard=shard,
            )
        self._store = store
        self.shard = shard
        self.table = schemas.commit_log_table(shard)
        # The marks as of ``_version``; the delta-rs handle may lag behind it (direct appends do not
        # move it) and is brought to it when a commit goes through delta-rs.
        self._version = -1
        self._hwm: HighWaterMarks | None = None
        self._dt: Snapshot | None = None
        self._interval = 0  # the checkpoint interval read from the handle _interval_of
        self._interval_of: Snapshot | None = None
        self._direct_allowed = direct_append_enabled() if direct is None else direct
        self._direct: DirectAppender | None = None  # decided on every load of the handle
        self._looked_at = 0.0  # when the writer last found its version the latest (object stores)
        self._lock = threading.Lock()
        self._host_lock = writers_host_lock(store, self.table, enabled=host_lock, wait_s=lock_wait_s)
        self._log_dir = os.path.join(store.uri(self.table), "_delta_log") if store.is_local else None
        # SYNC_FLUSH on a local store: the table directory whose commits are fsynced before an append
        # returns (object stores are durable on put).
        self._sync_flush = (
            store.uri(self.table) if store.is_local and store.config.flush_disk_type == SYNC_FLUSH else None
        )
        self.conflicts = 0  # lost races, for benchmarks and tests
        # Racing without the host lock: who waits how long (engine.store.commit_log.pacing). The writer's id
        # prefixes its batch ids, so that rivals can count the writers among the commits they missed.
        self._pacer = RacePacer()
        self._writer_id = uuid.uuid4().hex[:8]
        # (began, seconds) of the last checkpoint written, on the monotonic clock (CHECKPOINT_SHARE)
        self._last_checkpoint: tuple[float, float] | None = None
        self.checkpoints_left_out = 0  # due but left out (CHECKPOINT_SHARE), for benchmarks and tests

    @property
    def direct(self) -> bool:
        """Whether the next append without app transactions is committed directly."""
        return self._direct is not None

    def _catch_up(self, *, reopen: bool = False, handle: bool = False) -> None:
        """Move the marks to the latest version: by reading the commit files after them when
        appending directly (:meth:`_follow_log`), else (or with ``handle``, for a commit through
        delta-rs) with the delta-rs handle, a new one with ``reopen``."""
        looked_at = time.monotonic()
        if not (reopen or handle) and self._follow_log():
            self._looked_at = looked_at
            return
        base = self._version if self._hwm is not None else -1
        dt = self._dt
        if dt is not None and base - dt.version() >= RENEW_HANDLE_COMMITS:
            reopen = True  # a handle far behind is cheaper opened anew than moved on
        self._dt = dt = self._store.caught_up(self.table, None if reopen else dt)
        latest = dt.version()
        hwm, self._hwm = self._hwm, None
        if hwm is not None and 0 <= base <= latest and latest - base <= REPLAY_COMMITS:
            try:
                infos = [dt.commit_info(v) for v in range(base + 1, latest + 1)]
                replay(hwm, infos, HWM_KEY, MARKS_KEY)
                self._hwm = hwm
                self._pacer.saw(
                    (_writer_of(info.get(BATCH_KEY)) for info in infos), self._writer_id, time.monotonic()
                )
            except CommitTruncatedError:
                raise
            except StoreError:
                pass
        if self._hwm is None:
            self._hwm = read_hwm(dt)
        self._version = latest
        self._direct = (
            direct_appender(
                dt, schemas.COMMIT_LOG_SCHEMA, _PLAIN_COLUMNS, COMMIT_LOG_ROW_GROUP_ROWS, on_s3=True
            )
            if self._direct_allowed
            else None
        )
        self._looked_at = looked_at

    def _follow_log(self) -> bool:
        """Apply the commits after the marks' version by reading their files (a direct appender's
        catch-up). False, with nothing changed, when that does not do: no direct appender or marks
        yet, a commit that changed the table's protocol or metadata, too many commits, or a
        checkpoint past the last one found (see :meth:`DirectAppender.passed_by_checkpoint`)."""
        direct, hwm = self._direct, self._hwm
        if direct is None or hwm is None or self._version < 0:
            return False
        version = self._version
        commits: list[LogCommit] = []
        while True:
            commit = direct.read_commit(version + 1)
            if commit is None:
                break
            if commit.changes_table or len(commits) >= REPLAY_COMMITS:
                return False
            commits.append(commit)
            version += 1
        if direct.passed_by_checkpoint(version):
            return False
        # Only the newest commits that name every queue are parsed (the others' commitInfo lines
        # stay unread): following 8 rivals costs one parse, not 8.
        needed = covering((c.commit_info for c in reversed(commits)), HWM_KEY, MARKS_KEY)
        replay(hwm, needed, HWM_KEY, MARKS_KEY)
        self._version = version
        self._pacer.saw((_writer_of(c.batch_id) for c in commits), self._writer_id, time.monotonic())
        return True

    def _behind(self) -> bool:
        """Whether a newer commit than the marks' exists: a file probe on local stores, so a writer
        that is behind catches up before stamping instead of writing a doomed file. A direct
        appender also counts as behind when a checkpoint stands past its version (the commit files
        after it may have been cleaned up)."""
        if self._hwm is None or self._version < 0:
            return True
        if self._log_dir is None:
            # An object store: find out by committing (a conflict catches up), without a look first
            # unless what the writer knows is older than STALE_LOOK_S: the commit file after its
            # version may then have been cleaned up (log retention, after a checkpoint), and its
            # conditional put would land on a version the log has passed. A commit file is only
            # cleaned up once older than the log retention, so one made after the writer's last
            # look is still there while that look is younger than the retention.
            return self._direct is not None and time.monotonic() - self._looked_at > STALE_LOOK_S
        if os.path.exists(os.path.join(self._log_dir, f"{self._version + 1:020d}.json")):
            return True
        return self._direct is not None and self._direct.passed_by_checkpoint(self._version)

    def append(
        self,
        messages: Sequence[PendingMessage] | PendingBatch,
        *,
        app_transactions: Mapping[str, int] | None = None,
        custom_metadata: Mapping[str, str] | None = None,
    ) -> list[Stamped]:
        """Commit a batch as exactly one new commit-log version; results in input order.

        As :meth:`append_batch`, with one :class:`Stamped` per message.
        """
        return self.append_batch(
            messages, app_transactions=app_transactions, custom_metadata=custom_metadata
        ).rows()

    def append_batch(
        self,
        messages: Sequence[PendingMessage] | PendingBatch,
        *,
        app_transactions: Mapping[str, int] | None = None,
        custom_metadata: Mapping[str, str] | None = None,
    ) -> StampedBatch:
        """Commit a batch as exactly one new commit-log version; results in columns, input order.

        Args:
            messages: what to append.
            app_transactions: Delta app transactions (app id -> version) committed atomically with
                the batch. A broker job re-putting messages passes its progress here; if the table
                already records a version >= the one given for any app id (another instance, or a
                replay, got there first), nothing is written and an empty batch is returned. Ids starting
                with :data:`EXPIRING_APP_PREFIX` expire after the table's transaction retention
                (7 days): the guarantee holds within it. Other ids never expire.
            custom_metadata: extra commitInfo entries.

        With ``flush_disk_type = SYNC_FLUSH`` (local stores) it returns only once the commit's data
        file, commit file and their directories are fsynced (:mod:`engine.store.delta.durability`); the
        host lock is released before the flush, so other writers commit meanwhile.

        Raises:
            InvalidArgumentError: a message's queue belongs to another shard
                (:func:`~engine.protocol.shards.shard_of_queue`); nothing is written.
            CommitConflictError: every attempt lost its race (retryable; nothing written).
            CommitStateUnknownError: the commit may have happened, or (SYNC_FLUSH) happened but
                could not be flushed; nothing is acknowledged.
            StoreError: the write failed and nothing was committed.
        """
        batch = messages if isinstance(messages, PendingBatch) else PendingBatch.of(messages)
        if not batch.num_rows and not app_transactions:
            return NOTHING
        self._check_shard(batch)
        with self._lock:
            host_lock = self._host_lock
            if host_lock is not None and not host_lock.acquire():
                if not host_lock.usable:
                    self._host_lock = None  # no lock file here: optimistic only from now on
                host_lock = None
            try:
                racing = host_lock is None
                # a writer that just won a hot race gives the others their turn (no sleep call at
                # all otherwise: even a sleep of 0 hands the interpreter to other threads)
                if racing and (pause := self._pacer.hold(time.monotonic())) > 0:
                    time.sleep(pause)
                if self._behind():
                    self._catch_up()
                stamped = self._append_locked(batch, dict(app_transactions or {}), custom_metadata, racing)
            finally:
                if host_lock is not None:
                    host_lock.release()
            if stamped.version >= 0:
                if self._sync_flush is not None:
                    fsync_version(self._sync_flush, stamped.version)
                self._checkpoint_if_due(stamped.version)
                self._renew_if_aged()
            return stamped

    def _check_shard(self, batch: PendingBatch) -> None:
        """Refuse a batch holding a message whose queue lives in another shard (checked per distinct
        queue of the batch; a store of one shard has nothing to check)."""
        shards = self._store.commit_log_shards
        if shards == 1:
            return
        for topic, qid in batch.queues():
            owner = shard_of_queue(topic, qid, shards)
            if owner != self.shard:
                raise InvalidArgumentError(
                    f"queue {topic}:{qid} lives in commit-log shard {owner}, not in shard {self.shard} "
                    f"this writer appends to; nothing was written",
                    topic=topic,
                    queue_id=qid,
                    shard=self.shard,
                )

    def _renew_if_aged(self) -> None:
        """Reopen the delta-rs handle once it has aged (:attr:`Snapshot.aged`), after the host lock is
        released. Best effort: the batch is committed; a failed reopen leaves the writer without a
        handle, and the next append opens one."""
        if self._dt is None or not self._dt.aged:
            return
        try:
            self._catch_up(reopen=True)  # the marks in memory are kept (and moved on, if need be)
        except (StoreError, OSError):
            self._dt = None

    def _checkpoint_interval(self, dt: Snapshot) -> int:
        """The table's checkpoint interval, read once per handle (asking delta-rs for the table's
        properties at every commit cost more than the rest of the checkpoint check): a changed
        interval is seen once the handle is reopened (:meth:`_renew_if_aged`)."""
        if self._interval_of is not dt:
            self._interval, self._interval_of = checkpoint_interval(dt), dt
        return self._interval

    def _checkpoint_if_due(self, version: int) -> None:
        """Have the checkpoint Delta's post-commit hook would have written at ``version`` written on
        the checkpoint thread (:data:`background_checkpoints`), with the marks of ``version`` saved
        first (:func:`checkpoint_commit_log`): the send waits for its commit, not for the
        checkpoint. Best effort (:func:`checkpoint_if_due`), on a handle opened at ``version``; left
        out when the previous one began too recently (:data:`CHECKPOINT_SHARE`)."""
        dt, hwm = self._dt, self._hwm
        if dt is None or hwm is None or version <= 0 or version % self._checkpoint_interval(dt):
            return
        last = self._last_checkpoint
        if last is not None and time.monotonic() - last[0] < last[1] / CHECKPOINT_SHARE:
            self.checkpoints_left_out += 1
            return
        marks, store, table = hwm.copy(), self._store, self.table

        def write() -> None:
            began = time.monotonic()
            try:
                snapshot = store.snapshot(table, version)
            except StoreError:
                return
            checkpoint_if_due(
                snapshot, version, lambda cleanup: checkpoint_commit_log(snapshot, marks, cleanup=cleanup)
            )
            self._last_checkpoint = (began, time.monotonic() - began)

        background_checkpoints.submit(store.uri(table), write)

    def _forget(self) -> None:
        """Drop the handle and the marks: the next append loads both anew (after a failure that may
        have left them behind the log)."""
        self._dt, self._hwm, self._version, self._direct = None, None, -1, None

    def _append_locked(
        self,
        batch: PendingBatch,
        txns: dict[str, int],
        custom_metadata: Mapping[str, str] | None,
        racing: bool,
    ) -> StampedBatch:
        store_id = self._store.store_id
        attempts = self._store.config.max_commit_attempts
        batch_id = f"{self._writer_id}-{uuid.uuid4().hex}"
        for attempt in range(attempts):
            if attempt and self._behind():
                self._catch_up()  # after the pause: the commits landed meanwhile are seen too
            direct = None if txns else self._direct
            if direct is None and (self._dt is None or self._dt.version() != self._version):
                self._catch_up(handle=True)  # delta-rs commits on a handle at the marks' version
                direct = None if txns else self._direct
            hwm, base_version = self._hwm, self._version
            assert hwm is not None
            began = time.monotonic()
            now = now_ms()
            metadata = {**(custom_metadata or {}), BATCH_KEY: batch_id}
            try:
                if direct is not None:
                    table, results, delta = stamp(batch, hwm, store_id, now)
                    metadata[MARKS_KEY] = hwm.compact_json(delta, base_version + 1)
                    direct.commit(base_version + 1, direct.write_file(table), metadata)
                    version = base_version + 1
                else:
                    dt = self._dt
                    assert dt is not None
                    if any(dt.app_version(app) >= v for app, v in txns.items()):
                        return NOTHING
                    table, results, delta = stamp(batch, hwm, store_id, now)
                    metadata[MARKS_KEY] = hwm.compact_json(delta, base_version + 1)
                    version = commit_next(
                        dt,
                        rows=table,
                        transactions=delta_transactions(txns, EXPIRING_APP_PREFIX, now),
                        custom_metadata=metadata,
                        writer_properties=_WRITER_PROPERTIES,
                        hooks=NO_HOOKS,
                    )
            except CommitConflictError as exc:
                # (a commit on S3 was read back already: a conflict there is someone else's)
                if (
                    direct is None
                    or exc.context.get("read_back")
                    or not landed(direct, base_version + 1, batch_id, self.table)
                ):
                    self.conflicts += 1
                    # Wait first, then catch up (a catch-up before the pause would be stale after
                    # it). Off the host lock the pause spreads the racers; under it a rival of
                    # another host or a maintenance commit won: retry at once.
                    if racing:
                        time.sleep(self._pacer.lost(attempt + 1, time.monotonic()))
                    self._catch_up()
                    continue
                version = base_version + 1  # a retried link of a network file system made it
            except CommitStateUnknownError:
                self._forget()  # whatever happened, the handle and the marks may be behind the log
                raise
            except StoreError as exc:
                if direct is not None and exc.context.get("links_unsupported"):
                    self._direct_allowed, self._direct = False, None  # through delta-rs from now on
                    continue
                version = self._outcome(exc, direct, base_version, batch_id)
            else:
                if version != base_version + 1:  # pragma: no cover - delta-rs contract
                    self._forget()
                    raise CommitStateUnknownError(
                        f"commit landed at version {version}, expected {base_version + 1}",
                        table=self.table,
                    )
            hwm.apply(delta)
            if self._hwm is hwm:
                self._version = version
                self._looked_at = began  # the version was free when the commit was asked for
            ended = time.monotonic()
            if racing:
                self._pacer.won(ended - began, ended)
            return dataclasses.replace(results, version=version)
        raise CommitConflictError(
            f"commit-log append lost {attempts} races in a row; retry later", table=self.table
        )

    def _outcome(self, exc: StoreError, direct: DirectAppender | None, base: int, batch_id: str) -> int:
        """The version a failed write of ``batch_id`` landed at after all; raises when it did not.

        Raises:
            StoreError: nothing was stored.
            CommitStateUnknownError: whether it was cannot be read back.
        """
        if direct is not None:  # a commit file is put whole or not at all
            if failed_link_landed(exc, direct, base + 1, batch_id, self.table):
                return base + 1
            committed = None
        else:
            # Whatever happened, the handle and the marks may be behind the log now (a commit that
            # landed unseen moved it on): load both anew before the next batch.
            self._forget()
            committed = find_batch(lambda: self._store.snapshot(self.table), batch_id, base, self.table)
        if committed is None:
            raise StoreError(
                f"commit-log write failed, nothing was stored: {exc}",
                table=self.table,
                cause=exc.context.get("cause", exc),
            ) from exc
        return committed
