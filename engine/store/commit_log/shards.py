"""Appending to every commit-log shard of a store: one :class:`CommitLogWriter` per shard, a batch
split by the shard of each message's queue.

A store created with ``commit_log_shards = N`` keeps N commit logs, each with its own sequencer
(:mod:`engine.protocol.shards`). :class:`CommitLogs` has the writer's ``append`` / ``append_batch``
surface: it splits a batch by :func:`~engine.protocol.shards.shard_of_queue`, commits each shard's
part as one commit of that shard (parts of different shards in parallel threads) and returns the
offsets in input order. A commit is atomic within one shard only: a batch spread over shards is
several commits, each all-or-nothing (:meth:`CommitLogs.commit_parts` tells which parts landed).
App transactions and commit metadata belong to one shard's commit, so they are passed only where
the caller names the shard (or the store has one); a caller keeping progress markers per shard
commits to each shard through :meth:`CommitLogs.writer`.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from engine.errors import InvalidArgumentError, MQError
from engine.protocol.shards import shard_of_queue
from engine.store.commit_log.stamping import NOTHING, PendingBatch, PendingMessage, Stamped, StampedBatch
from engine.store.commit_log.writer import CommitLogWriter
from engine.store.delta import LOCK_WAIT_S, background_checkpoints
from engine.store.store import Store


@dataclass(frozen=True)
class ShardPart:
    """What one shard's commit of a split batch did: the batch positions it held (input order), and
    either their offsets (``stamped``) or the error that left them unwritten (``error``)."""

    shard: int
    positions: list[int]
    stamped: StampedBatch | None
    error: MQError | None


def _merge(parts: Sequence[ShardPart], n: int) -> StampedBatch:
    """The offsets of committed ``parts`` scattered back to input order (``version`` is the commit's
    when there is one part, else -1: each shard committed its own version)."""
    if len(parts) == 1:
        assert parts[0].stamped is not None
        return parts[0].stamped
    msg_ids: list[str] = [""] * n
    uniq: list[str] = [""] * n
    topics: list[str] = [""] * n
    qids: list[int] = [0] * n
    offsets: list[int] = [0] * n
    physical: list[int] = [0] * n
    store_ts = 0
    for part in parts:
        s = part.stamped
        assert s is not None
        store_ts = max(store_ts, s.store_ts_ms)
        for j, i in enumerate(part.positions):
            msg_ids[i], uniq[i], topics[i] = s.msg_ids[j], s.uniq_keys[j], s.topics[j]
            qids[i], offsets[i], physical[i] = s.queue_ids[j], s.queue_offsets[j], s.physical[j]
    return StampedBatch(msg_ids, uniq, topics, qids, offsets, physical, store_ts)


class CommitLogs:
    """The commit-log writers of one store, one per shard (opened on first use); thread-safe.

    Args:
        store: the store to append to.
        host_lock: as :class:`CommitLogWriter` (each shard has its own lock file).
        lock_wait_s: as :class:`CommitLogWriter`.
    """

    def __init__(
        self, store: Store, *, host_lock: bool | None = None, lock_wait_s: float = LOCK_WAIT_S
    ) -> None:
        self._store = store
        self.shards = store.commit_log_shards
        self._host_lock = host_lock
        self._lock_wait_s = lock_wait_s
        self._writers: dict[int, CommitLogWriter] = {}
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None

    def writer(self, shard: int) -> CommitLogWriter:
        """The writer of commit-log shard ``shard`` (the same one on every call).

        Raises:
            InvalidArgumentError: ``shard`` is not one of the store's shards.
        """
        found = self._writers.get(shard)
        if found is not None:
            return found
        with self._lock:
            found = self._writers.get(shard)
            if found is None:
                found = CommitLogWriter(
                    self._store, host_lock=self._host_lock, lock_wait_s=self._lock_wait_s, shard=shard
                )
                self._writers[shard] = found
            return found

    def shard_of(self, topic: str, queue_id: int) -> int:
        """The shard holding queue ``queue_id`` of ``topic`` in this store."""
        return shard_of_queue(topic, queue_id, self.shards)

    def lost_races(self, shard: int) -> int:
        """Races lost so far by the writer of ``shard`` (0 before it has one)."""
        found = self._writers.get(shard)
        return 0 if found is None else found.conflicts

    @property
    def conflicts(self) -> int:
        """Races lost by the writers so far (benchmarks and tests)."""
        return sum(w.conflicts for w in list(self._writers.values()))

    def split(self, batch: PendingBatch) -> dict[int, list[int]]:
        """The positions of ``batch`` each shard holds, in input order (shards in ascending order)."""
        n = batch.num_rows
        if self.shards == 1 or not n:
            return {0: list(range(n))} if n else {}
        topics, qids = batch.topics, batch.queue_ids
        if topics.count(topics[0]) == n and qids.count(qids[0]) == n:
            return {self.shard_of(topics[0], qids[0]): list(range(n))}
        owners: dict[tuple[str, int], int] = {}
        by_shard: dict[int, list[int]] = {}
        for i, pair in enumerate(zip(topics, qids, strict=True)):
            shard = owners.get(pair)
            if shard is None:
                shard = owners[pair] = self.shard_of(*pair)
            by_shard.setdefault(shard, []).append(i)
        return dict(sorted(by_shard.items()))

    def commit_parts(self, messages: Sequence[PendingMessage] | PendingBatch) -> list[ShardPart]:
        """Commit each shard's part of a batch (in parallel when it spans shards); one
        :class:`ShardPart` per shard touched, each committed or failed as a whole.

        Raises:
            InvalidMessageError, InvalidArgumentError: a bad message (nothing is written).
        """
        batch = messages if isinstance(messages, PendingBatch) else PendingBatch.of(messages)
        split = self.split(batch)
        if len(split) <= 1:
            # One shard (every batch of a single-shard store): no copy, no thread; errors propagate.
            shard, positions = next(iter(split.items()), (0, []))
            return [ShardPart(shard, positions, self.writer(shard).append_batch(batch), None)]
        for shard in split:  # a bad shard number fails here, before anything is committed
            self.writer(shard)

        def one(item: tuple[int, list[int]]) -> ShardPart:
            shard, positions = item
            try:
                return ShardPart(
                    shard, positions, self.writer(shard).append_batch(batch.take(positions)), None
                )
            except MQError as exc:
                return ShardPart(shard, positions, None, exc)

        return list(self._executor().map(one, split.items()))

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=self.shards, thread_name_prefix="mq-shard")
            return self._pool

    def append_batch(
        self,
        messages: Sequence[PendingMessage] | PendingBatch,
        *,
        shard: int | None = None,
        app_transactions: Mapping[str, int] | None = None,
        custom_metadata: Mapping[str, str] | None = None,
    ) -> StampedBatch:
        """Commit a batch, one commit per shard it touches; offsets in input order.

        Args:
            messages: what to append.
            shard: the shard every message belongs to, and where ``app_transactions`` and
                ``custom_metadata`` are committed (required with either, unless the store has one
                shard); see :meth:`CommitLogWriter.append_batch`.
            app_transactions: as :meth:`CommitLogWriter.append_batch`, on ``shard``.
            custom_metadata: as :meth:`CommitLogWriter.append_batch`, on ``shard``.

        Returns:
            The offsets; ``version`` is the commit's when one shard was written, else -1.

        Raises:
            InvalidArgumentError: app transactions or metadata without a shard in a store of several,
                or a message whose queue is not in ``shard``; nothing is written.
            CommitConflictError, CommitStateUnknownError, StoreError: as
                :meth:`CommitLogWriter.append_batch`. For a batch spread over shards, the first
                failed shard's error, raised once every shard's commit has finished: the parts of
                other shards may be stored (see :meth:`commit_parts` to know which).
        """
        if shard is None and (app_transactions or custom_metadata):
            if self.shards > 1:
                raise InvalidArgumentError(
                    "app transactions and commit metadata go to one commit-log shard: name it "
                    f"(shard=) in a store of {self.shards} shards; nothing was written",
                    shards=self.shards,
                )
            shard = 0
        if shard is not None:
            return self.writer(shard).append_batch(
                messages, app_transactions=app_transactions, custom_metadata=custom_metadata
            )
        batch = messages if isinstance(messages, PendingBatch) else PendingBatch.of(messages)
        if not batch.num_rows:
            return NOTHING
        parts = self.commit_parts(batch)
        for part in parts:
            if part.error is not None:
                raise part.error
        return _merge(parts, batch.num_rows)

    def append(
        self,
        messages: Sequence[PendingMessage] | PendingBatch,
        *,
        shard: int | None = None,
        app_transactions: Mapping[str, int] | None = None,
        custom_metadata: Mapping[str, str] | None = None,
    ) -> list[Stamped]:
        """As :meth:`append_batch`, with one :class:`Stamped` per message."""
        return self.append_batch(
            messages, shard=shard, app_transactions=app_transactions, custom_metadata=custom_metadata
        ).rows()

    def close(self, checkpoint_wait_s: float = 30) -> None:
        """Stop the threads that commit shards in parallel (the writers stay usable), once the
        checkpoints the commits made due are written (at most ``checkpoint_wait_s``; a checkpoint
        not written then is the next interval's or maintenance's)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
        background_checkpoints.wait(checkpoint_wait_s)


_SHARED: weakref.WeakKeyDictionary[Store, CommitLogs] = weakref.WeakKeyDictionary()
_SHARED_LOCK = threading.Lock()


def shared_commit_logs(store: Store) -> CommitLogs:
    """The commit-log writers this process shares for ``store``, for callers that hold none of
    their own (one sequencer handle per shard and process is enough)."""
    with _SHARED_LOCK:
        logs = _SHARED.get(store)
        if logs is None:
            logs = _SHARED[store] = CommitLogs(store)
        return logs
