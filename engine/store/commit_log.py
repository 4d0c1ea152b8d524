"""Optimistic sequencing of the commit log on the Delta log itself.

Every commit to ``commit_log`` carries, in its commitInfo, the high-water marks after it: the next
physical offset, the last store time and the next offsets of the queues it wrote, plus a rolling
slice of the others (``mq.marks``; the form and how the marks are rebuilt from it are in
:mod:`engine.store.marks`), so commit metadata does not grow with the number of topics. A writer
stamps its batch from the marks of the version it read, then commits exactly the next version with
automatic retries disabled. If another writer took that version, it applies the commits it missed
to its marks and stamps again. The Delta log is the lock: no offset is assigned twice and queue
offsets stay dense, however many processes append.

On a local store, writers of one host also queue on an advisory lock (``flock`` on
``<store>/_locks/commit_log.lock``) held from catch-up to commit, so they take turns instead of
racing: a lost race costs a rewritten data file and a snapshot refresh, and under contention the
writer that just won (its snapshot current) tends to win again, starving the others. The lock is
only an optimization: the optimistic protocol above stays the correctness mechanism (writers on
other hosts or object stores, maintenance commits, and writers with the lock turned off with
``MQ_SEQUENCER_LOCK=0`` still race and retry). The kernel drops a dead process's lock at once; a
stopped holder delays the others at most ``LOCK_WAIT_S`` (:mod:`engine.store.hostlock`), after
which they append without it.

Without the lock, racing writers are paced so that they take turns (:mod:`engine.store.pacing`):
a loser first waits (a jittered pause of about one commit time per rival writer, halved for every
further race it lost in a row) and only then catches up, so it stamps from the newest version
instead of from one already stale after the pause (before, it caught up and then slept, and lost
again to whatever landed meanwhile); a writer that wins while the race is hot holds its next append
back by about one commit time per rival, since its current handle would otherwise win again. Rivals
are counted from the commits a writer missed: each batch id is ``<writer>-<batch>``. The give-up
rule stays (``max_commit_attempts`` lost races in a row raise the retryable
:class:`CommitConflictError`). Measured with ``bench/contention.py --writers 8 --sends 40 --no-lock``
on the 2-core bench machine while it was shared (1-minute load average 10 to 25, so the figures are
noisy): before, 7 msg/s, send p50 161 ms, p99 10.1 s, max 18.1 s, 753 lost races; after, 11 msg/s,
p50 538 ms, p99 2.9 s, max 5.9 s, 409 lost races; no writer gave up in either 40-send run (the
150-send runs of issue 13 saw 4 of 8 give up before). Pacing trades the median for the tail: the
lucky writer no longer wins every race. 16 writers x 15 sends: none gave up, longest wait 3.6 s
at load 10; at load 25 to 40 (more runnable processes than the 2 cores serve by 20x), 3 msg/s, 917
lost races and a 51 s longest wait against 2.5 msg/s, 1,528 and 59 s before: when every attempt
takes seconds of wall time, pacing cannot shorten the race window much.

A lost race rewrites the batch's data file: the offsets are columns of the rows (``physical_offset``,
``queue_offset``, ``store_ts_ms`` and the ``msg_id`` made from the physical offset; the table is
self-describing and compaction-safe), so there is no cheaper re-stamp that keeps files readable by
any Delta reader. Pacing makes races rarer instead. With the lock, only writers of other hosts and
maintenance commits still cause them.

What an append costs is mostly delta-rs's, and grows with two things (``bench/commit_cost.py``):
the table's live data files, mildly (one message: about 4 ms at 50 files, 10-15 ms at 2000 on the
2-core bench machine), and the number of versions the writer's DeltaTable handle has moved on by
since it was opened, steeply (the handle keeps one more Arrow batch of file actions per version and
every commit goes over all of them: 4 ms fresh, 42 ms after 400 versions). The writer therefore
reopens its handle once it has aged (:attr:`~engine.store.delta.Snapshot.aged`). Refreshing a
snapshot by one version costs about as much as an append, so lost races are expensive.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
import uuid
from collections.abc import Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import ColumnProperties, WriterProperties

from engine.config import SYNC_FLUSH
from engine.errors import (
    CommitConflictError,
    CommitStateUnknownError,
    CommitTruncatedError,
    InvalidArgumentError,
    StoreError,
)
from engine.protocol.shards import shard_base, shard_of_queue
from engine.store import marks_snapshots, schemas
from engine.store.commit_markers import BATCH_KEY, EXPIRING_APP_PREFIX, HWM_KEY, MARKS_KEY
from engine.store.commits import NO_HOOKS, checkpoint_if_due, commit_next
from engine.store.delta import MAX_WALK_BACK, Snapshot
from engine.store.delta import (
    app_transactions as delta_transactions,
)
from engine.store.durability import fsync_version
from engine.store.hostlock import LOCK_DIR, LOCK_WAIT_S, HostLock, host_lock_enabled
from engine.store.marks import HighWaterMarks, Rebuild, replay
from engine.store.pacing import RacePacer
from engine.store.stamping import (
    NOTHING,
    PendingBatch,
    PendingMessage,
    Stamped,
    StampedBatch,
    stamp,
)
from engine.store.store import Store, now_ms


def read_hwm(snapshot: Snapshot) -> HighWaterMarks:
    """High-water marks as of ``snapshot``'s version.

    Walks back from that version over the commits' marks until they name every queue, or to the
    newest full mark (see :mod:`engine.store.marks`); if the log no longer holds enough of them,
    recovers the marks by scanning the table.
    """
    rebuild = Rebuild(HWM_KEY, MARKS_KEY)
    version = snapshot.version()
    for v in range(version, max(version - MAX_WALK_BACK, -1), -1):
        try:
            info = snapshot.commit_info(v)
        except CommitTruncatedError:
            raise
        except StoreError:
            break  # older commits were cleaned up after a checkpoint
        if rebuild.add(info):
            break
    marks = rebuild.result()
    if marks is None:
        marks = _from_saved_marks(snapshot)
    return marks if marks is not None else recover_hwm_by_scan(snapshot)


def _from_saved_marks(snapshot: Snapshot) -> HighWaterMarks | None:
    """The marks saved at the newest checkpoint (:mod:`engine.store.marks_snapshots`), moved on
    over the commits since; None when there are none or those commits are gone too."""
    version = snapshot.version()
    saved = marks_snapshots.load(snapshot.uri, snapshot.storage_options, version)
    if saved is None:
        return None
    base, hwm = saved
    try:
        replay(hwm, (snapshot.commit_info(v) for v in range(base + 1, version + 1)), HWM_KEY, MARKS_KEY)
    except CommitTruncatedError:
        raise
    except StoreError:
        return None
    return hwm


def _writer_of(info: Mapping[str, object]) -> str:
    """The writer id prefixing a commit's batch id ("" for commits of other kinds)."""
    batch = info.get(BATCH_KEY)
    return batch.split("-", 1)[0] if isinstance(batch, str) and "-" in batch else ""


def checkpoint_commit_log(snapshot: Snapshot, hwm: HighWaterMarks, *, cleanup: bool = True) -> None:
    """Checkpoint the commit log at ``snapshot``'s version, whose marks are ``hwm``: the marks are
    saved first, since the cleanup may delete the commits that carry them.

    Raises:
        StoreError: the marks or the checkpoint could not be written (no cleanup happened then).
    """
    marks_snapshots.save(snapshot.uri, snapshot.storage_options, snapshot.version(), hwm)
    snapshot.checkpoint(cleanup=cleanup)


def recover_hwm_by_scan(snapshot: Snapshot) -> HighWaterMarks:
    """Rebuild the marks from the rows themselves (slow; only when the log lost them)."""
    table = snapshot.dataset().to_table(
        columns=["physical_offset", "size", "topic", "queue_id", "queue_offset", "store_ts_ms"]
    )
    hwm = HighWaterMarks()
    if table.num_rows == 0:
        hwm.physical = shard_base(schemas.shard_of_table(snapshot.name) or 0)
        return hwm
    ends = pc.add(table["physical_offset"], pc.cast(table["size"], pa.int64()))
    hwm.physical = int(pc.max(ends).as_py())
    hwm.store_ts_ms = int(pc.max(table["store_ts_ms"]).as_py())
    grouped = table.group_by(["topic", "queue_id"]).aggregate([("queue_offset", "max")])
    for row in grouped.to_pylist():
        offsets = hwm.queues.setdefault(row["topic"], [])
        while len(offsets) <= row["queue_id"]:
            offsets.append(0)
        offsets[row["queue_id"]] = int(row["queue_offset_max"]) + 1
    return hwm


# Small row groups let a pull read a few hundred rows instead of a whole micro-batch file.
COMMIT_LOG_ROW_GROUP_ROWS = 256
# Bodies are never filtered on and rarely repeat: no dictionary attempt and no page statistics for
# them (both cost CPU on every write and buy nothing).
_WRITER_PROPERTIES = WriterProperties(
    max_row_group_size=COMMIT_LOG_ROW_GROUP_ROWS,
    column_properties={"body": ColumnProperties(dictionary_enabled=False, statistics_enabled="NONE")},
)
# Checkpoints are written after the host lock is released (see CommitLogWriter.append): a
# checkpoint of a table of many small files takes longer than the commit it follows.
# A writer that fell behind by at most this many versions applies them to its marks one by one;
# further behind, it rebuilds the marks (a walk back of about as many commit files).
REPLAY_COMMITS = 256


class CommitLogWriter:
    """Appends batches to one commit-log shard with sequenced offsets; one per process and shard is
    enough.

    Thread-safe: batches from several threads are committed one after another. On a local store,
    writers of the host take turns on :class:`HostLock` (see the module docstring).

    Args:
        store: the store to append to.
        host_lock: take the inter-process lock around each append (local stores only); default
            ``MQ_SEQUENCER_LOCK`` (on unless ``0``).
        lock_wait_s: longest wait for the lock before an append goes ahead without it.
        shard: the commit-log shard appended to (:mod:`engine.protocol.shards`); default 0, the
            only one of a store without shards.

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
        self._dt: Snapshot | None = None
        self._hwm: HighWaterMarks | None = None
        self._lock = threading.Lock()
        use_lock = host_lock_enabled() if host_lock is None else host_lock
        self._host_lock = (
            HostLock(os.path.join(store.root, LOCK_DIR, f"{self.table}.lock"), lock_wait_s)
            if use_lock and store.is_local
            else None
        )
        self._log_dir = os.path.join(store.uri(self.table), "_delta_log") if store.is_local else None
        # SYNC_FLUSH on a local store: the table directory whose commits are fsynced before an append
        # returns (object stores are durable on put).
        self._sync_flush = (
            store.uri(self.table) if store.is_local and store.config.flush_disk_type == SYNC_FLUSH else None
        )
        self.conflicts = 0  # lost races, for benchmarks and tests
        # Racing without the host lock: who waits how long (engine.store.pacing). The writer's id
        # prefixes its batch ids, so that rivals can count the writers among the commits they missed.
        self._pacer = RacePacer()
        self._writer_id = uuid.uuid4().hex[:8]

    def _catch_up(self, *, reopen: bool = False) -> tuple[Snapshot, HighWaterMarks]:
        """Move the handle (a new one with ``reopen``) to the latest version and the marks with it:
        by applying the commits since the marks' version when there are few (the marks are kept in
        memory), else by rebuilding them from the log."""
        base = self._dt.version() if self._dt is not None else -1
        self._dt = self._store.caught_up(self.table, None if reopen else self._dt)
        latest = self._dt.version()
        hwm, self._hwm = self._hwm, None
        if hwm is not None and 0 <= base <= latest and latest - base <= REPLAY_COMMITS:
            try:
                dt = self._dt
                infos = [dt.commit_info(v) for v in range(base + 1, latest + 1)]
                replay(hwm, infos, HWM_KEY, MARKS_KEY)
                self._hwm = hwm
                self._pacer.saw((_writer_of(info) for info in infos), self._writer_id, time.monotonic())
            except CommitTruncatedError:
                raise
            except StoreError:
                pass
        if self._hwm is None:
            self._hwm = read_hwm(self._dt)
        return self._dt, self._hwm

    def _behind(self) -> bool:
        """Whether a newer commit than our snapshot exists: a file probe on local stores, so a
        writer that is behind catches up before stamping instead of writing a doomed file."""
        if self._dt is None or self._hwm is None:
            return True
        if self._log_dir is None:
            return False  # an object store: find out by committing (a conflict catches up)
        return os.path.exists(os.path.join(self._log_dir, f"{self._dt.version() + 1:020d}.json"))

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
        file, commit file and their directories are fsynced (:mod:`engine.store.durability`); the
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
                if racing:  # a writer that just won a hot race gives the others their turn
                    time.sleep(self._pacer.hold(time.monotonic()))
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
        if shards == 1 or not batch.num_rows:
            return
        topics, qids = batch.topics, batch.queue_ids
        n = batch.num_rows
        if topics.count(topics[0]) == n and qids.count(qids[0]) == n:
            pairs: set[tuple[str, int]] = {(topics[0], qids[0])}
        else:
            pairs = set(zip(topics, qids, strict=True))
        for topic, qid in pairs:
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
        """Reopen the handle once it has aged (:attr:`Snapshot.aged`: moved on by
        :data:`RENEW_HANDLE_COMMITS` versions, or by the checkpoint interval and so past a
        checkpoint, such as the one this writer may just have written). On a 50-file commit log:
        4 ms per append on a fresh handle, 42 ms after 400 versions, 12 ms on a fresh handle of the
        same table grown to 490 files.

        Done after the host lock is released, like the checkpoint. Best effort: the batch is already
        committed, so a failed reopen only leaves the writer without a handle, and the next append
        opens one (and reports the failure then, if it persists).
        """
        if self._dt is None or not self._dt.aged:
            return
        try:
            self._catch_up(reopen=True)  # the marks in memory are kept (and moved on, if need be)
        except (StoreError, OSError):
            self._dt = None

    def _checkpoint_if_due(self, version: int) -> None:
        """Write the checkpoint Delta's post-commit hook would have written at ``version``, with the
        marks saved first (:func:`checkpoint_commit_log`); best effort (:func:`checkpoint_if_due`).
        """
        dt, hwm = self._dt, self._hwm
        if dt is None or hwm is None:
            return
        checkpoint_if_due(dt, version, lambda cleanup: checkpoint_commit_log(dt, hwm, cleanup=cleanup))

    def _append_locked(
        self,
        batch: PendingBatch,
        txns: dict[str, int],
        custom_metadata: Mapping[str, str] | None,
        racing: bool,
    ) -> StampedBatch:
        assert self._dt is not None and self._hwm is not None
        store_id = self._store.store_id
        attempts = self._store.config.max_commit_attempts
        batch_id = f"{self._writer_id}-{uuid.uuid4().hex}"
        for attempt in range(attempts):
            if attempt and self._behind():
                self._catch_up()  # after the pause: the commits landed meanwhile are seen too
            dt, hwm = self._dt, self._hwm
            assert dt is not None and hwm is not None
            began = time.monotonic()
            base_version = dt.version()
            if any(dt.app_version(app) >= v for app, v in txns.items()):
                return NOTHING
            now = now_ms()
            table, results, delta = stamp(batch, hwm, store_id, now)
            try:
                version = commit_next(
                    dt,
                    rows=table,
                    transactions=delta_transactions(txns, EXPIRING_APP_PREFIX, now),
                    custom_metadata={
                        **(custom_metadata or {}),
                        MARKS_KEY: hwm.compact_json(delta, base_version + 1),
                        BATCH_KEY: batch_id,
                    },
                    writer_properties=_WRITER_PROPERTIES,
                    hooks=NO_HOOKS,
                )
            except CommitConflictError:
                self.conflicts += 1
                # Wait first, then catch up (a catch-up before the pause would be stale after it).
                # Off the host lock the pause spreads the racers; under it a rival of another host
                # or a maintenance commit won: retry at once.
                if racing:
                    time.sleep(self._pacer.lost(attempt + 1, time.monotonic()))
                self._catch_up()
                continue
            except StoreError as exc:
                # Whatever happened, the handle and the marks may be behind the log now (a commit
                # that landed unseen moved it on): catch up before the next batch.
                self._dt = None
                committed = self._find_batch(batch_id, base_version)
                if committed is None:
                    raise StoreError(
                        f"commit-log write failed, nothing was stored: {exc}",
                        table=self.table,
                        cause=exc.context.get("cause", exc),
                    ) from exc
                version = committed
            else:
                if version != base_version + 1:  # pragma: no cover - delta-rs contract
                    self._dt = None
                    raise CommitStateUnknownError(
                        f"commit landed at version {version}, expected {base_version + 1}",
                        table=self.table,
                    )
            hwm.apply(delta)
            ended = time.monotonic()
            if racing:
                self._pacer.won(ended - began, ended)
            return dataclasses.replace(results, version=version)
        raise CommitConflictError(
            f"commit-log append lost {attempts} races in a row; retry later", table=self.table
        )

    def _find_batch(self, batch_id: str, base_version: int) -> int | None:
        """After an I/O error, tell whether our commit happened after all."""
        try:
            dt = self._store.snapshot(self.table)
            latest = dt.version()
            if latest <= base_version:
                return None
            for info in dt.recent_commit_infos(latest - base_version):
                if info.get(BATCH_KEY) == batch_id:
                    return int(info["version"])
            return None
        except Exception as exc:
            raise CommitStateUnknownError(
                f"commit-log write failed and its outcome cannot be read back: {exc}",
                table=self.table,
                cause=exc,
            ) from exc
