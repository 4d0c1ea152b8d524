"""The push consumer: RocketMQ's ``DefaultMQPushConsumer`` over the pull machinery.

Background threads do what RocketMQ's client does: a service thread heartbeats, commits offsets,
flushes consumer actions and sends back messages stuck in a listener past ``consume_timeout``; a
rebalance thread recomputes this instance's queues from the live members and the allocation
strategy; one thread per assigned queue long-polls it into the queue's cache (pausing while the
cache is over its bounds, :mod:`.pull_service`); a pool of consume threads calls the listener
(:mod:`.consume_service`), so a listener that hangs holds one pool thread, not its queue.

Delivery is at least once. The offset committed for a queue is its process queue's smallest cached
offset (never past a message not consumed), every ``commit_interval_ms``, when a queue is
reassigned away and at shutdown, always after the consumer actions (NACKs) of the messages it
passes are durable, so a crash re-delivers rather than loses. Orderly listeners consume a queue only
while holding its lock, so a queue moving between members is never consumed by two at once.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Sequence

from engine.client.admin import Admin
from engine.client.membership import GroupMembership, default_consumer_id, host_client_id
from engine.client.offsets import ConsumeFrom, start_offset
from engine.client.pull import PullConsumer
from engine.client.push.consume_service import UNLIMITED_RECONSUME, ConsumeService, ConsumeSetup, log_failure
from engine.client.push.listener import Listener, ListenerCall, MessageListener
from engine.client.push.process_queue import ProcessQueue, ProcessQueueInfo
from engine.client.push.pull_service import pull_loop
from engine.client.push.resets import LiveResets
from engine.client.push.settings import push_settings
from engine.client.resets import ResetWatcher
from engine.closing import Closing
from engine.errors import ConsumerClosedError, ConsumerError, InvalidArgumentError
from engine.protocol import (
    RETRY_PREFIX,
    retry_topic,
    validate_group_name,
    validate_topic_name,
)
from engine.protocol.rebalance import (
    AllocateStrategy,
    MessageModel,
    MessageQueue,
    StrategyName,
    resolve_strategy,
)
from engine.protocol.selectors import MessageSelector
from engine.store.action_log import ActionLogWriter
from engine.store.consume_queue import QueueIndex
from engine.store.consumer_offset import OffsetStore
from engine.store.store import Store

_log = logging.getLogger(__name__)
# A queue waiting for its lock looks again this soon (or every rebalance, if that is sooner).
_RELOCK_WAIT_S = 0.2
_ACTION_FLUSH_S = 0.2  # NACKs reach the action log this soon (and always before offsets pass them)


class PushConsumer(Closing):
    """Messages pushed to a listener, with rebalance, offsets, retries and orderly consumption.

    Args:
        store: an open store.
        group: the consumer group.
        model: CLUSTERING (queues divided among the group's members, offsets shared) or
            BROADCASTING (every instance gets every message and keeps its own offsets).
        allocate: rebalance strategy, ``"averagely"``, ``"averagely_by_circle"``,
            ``"consistent_hash"`` or a callable ``(queues, consumer_ids, me) -> queues``.
        consume_from: where to start a queue the group has no committed offset for (LAST: its
            end, or 0 while the queue is young: ``EngineConfig.in_memory_max_bytes``, as RocketMQ).
        consume_from_timestamp_ms: the time for ``ConsumeFrom.TIMESTAMP`` (default 30 min ago).
        max_reconsume_times: failures after which a message goes to ``%DLQ%<group>``; -1 or None
            (the default) means 16 (the engine's ``max_reconsume_times``) for a concurrent
            listener and no limit for an orderly one, as in RocketMQ.
        pull_batch_size: most messages pulled from a queue at a time (1..1024; RocketMQ's
            ``pullBatchSize``, 32, the engine's ``pull_batch_size``).
        consume_message_batch_max_size: most messages passed to one listener call (RocketMQ's
            ``consumeMessageBatchMaxSize``, 1).
        consume_thread_min, consume_thread_max: the consume pool's threads (RocketMQ's
            ``consumeThreadMin`` / ``consumeThreadMax``, 20 and 20; 1..1000). At most
            ``consume_thread_max`` listener calls run at once, over every queue. Differs on
            purpose: RocketMQ's executor has an unbounded queue and never grows past the min; this
            pool grows to the max while every thread is busy and shrinks back after 60 s idle.
        pull_threshold_for_queue: cached messages of a queue past which pulling it pauses
            (RocketMQ's ``pullThresholdForQueue``, 1000; 1..65535).
        pull_threshold_size_for_queue: cached body MiB of a queue past which pulling it pauses
            (RocketMQ's ``pullThresholdSizeForQueue``, 100; 1..1024).
        consume_concurrently_max_span: concurrently: pulling a queue pauses while its cached
            offsets span more than this (RocketMQ's ``consumeConcurrentlyMaxSpan``, 2000), so one
            slow message does not let the cache run far ahead of the committed offset.
        consume_timeout: minutes a message may stay inside a concurrent listener call before it is
            sent back as a retry (RocketMQ's ``consumeTimeout``, 15): CLUSTERING NACKs it with
            delay level 3 and it leaves the queue's cache, so the offset moves on and the hung
            call's answer is ignored; BROADCASTING drops it, as it drops a failed message. The
            check runs with the service loop (a fraction of a second), where RocketMQ's
            ``cleanExpireMsg`` runs every ``consumeTimeout`` minutes and looks only at each queue's
            first message: here a message goes back as soon as it is due. Orderly consumers are
            never timed out (as in RocketMQ). The call itself keeps its pool thread until it returns.
        consume_timeout_ms: the same in milliseconds; when given, it wins over ``consume_timeout``.
        await_termination_ms_when_shutdown: how long :meth:`shutdown` (and a queue moving away)
            waits for the listener calls in flight before committing (RocketMQ's
            ``awaitTerminationMillisWhenShutdown``, 0). Differs on purpose: 10 s here, so a batch
            finishing in time is committed rather than consumed again; a call still running after
            it is abandoned (its messages come again from the committed offset), never waited for.
        instance_id: this instance's id in the group. Default: unique per instance for clustering;
            ``ip@DEFAULT`` for broadcasting (RocketMQ's client id), so a broadcasting consumer
            restarted on the same host resumes from its offsets; give each of several
            broadcasting consumers of one group on one host its own id.
        heartbeat_interval_ms, member_timeout_ms: liveness (a member silent for the timeout is
            dropped from the group).
        rebalance_interval_ms: how often the queues are reallocated.
        commit_interval_ms: how often consumed offsets are committed.
        pull_suspend_ms: long-polling time of one pull.
        lock_ttl_ms, relock_interval_ms: orderly queue-lock lease and its renewal period (must be
            under half the lease).
        suspend_current_queue_ms: orderly: pause of a queue after a failed consume.

    Raises:
        InvalidArgumentError: a bad group or setting.
    """

    def __init__(
        self,
        store: Store,
        group: str,
        model: MessageModel | str = MessageModel.CLUSTERING,
        allocate: StrategyName | AllocateStrategy = "averagely",
        consume_from: ConsumeFrom | str = ConsumeFrom.LAST,
        *,
        consume_from_timestamp_ms: int | None = None,
        max_reconsume_times: int | None = None,
        pull_batch_size: int | None = None,
        consume_message_batch_max_size: int = 1,
        consume_thread_min: int = 20,
        consume_thread_max: int = 20,
        pull_threshold_for_queue: int = 1_000,
        pull_threshold_size_for_queue: int = 100,
        consume_concurrently_max_span: int = 2_000,
        consume_timeout: int = 15,
        consume_timeout_ms: int | None = None,
        await_termination_ms_when_shutdown: int = 10_000,
        instance_id: str | None = None,
        heartbeat_interval_ms: int = 2_000,
        member_timeout_ms: int = 6_000,
        rebalance_interval_ms: int = 1_000,
        commit_interval_ms: int = 5_000,
        pull_suspend_ms: int = 1_000,
        lock_ttl_ms: int = 60_000,
        relock_interval_ms: int = 20_000,
        suspend_current_queue_ms: int = 1_000,
    ) -> None:
        self.group = validate_group_name(group)
        try:
            self.model = MessageModel(model)
            self.consume_from = ConsumeFrom(consume_from)
        except ValueError as exc:
            raise InvalidArgumentError(
                f"model must be one of {[m.value for m in MessageModel]} and consume_from one of "
                f"{[c.value for c in ConsumeFrom]}: {exc}",
                model=model,
                consume_from=consume_from,
            ) from exc
        self._allocate = resolve_strategy(allocate)
        settings = push_settings(
            store.config,
            consume_from_timestamp_ms=consume_from_timestamp_ms,
            max_reconsume_times=max_reconsume_times,
            pull_batch_size=pull_batch_size,
            consume_message_batch_max_size=consume_message_batch_max_size,
            consume_thread_min=consume_thread_min,
            consume_thread_max=consume_thread_max,
            pull_threshold_for_queue=pull_threshold_for_queue,
            pull_threshold_size_for_queue=pull_threshold_size_for_queue,
            consume_concurrently_max_span=consume_concurrently_max_span,
            consume_timeout=consume_timeout,
            consume_timeout_ms=consume_timeout_ms,
            await_termination_ms_when_shutdown=await_termination_ms_when_shutdown,
            heartbeat_interval_ms=heartbeat_interval_ms,
            member_timeout_ms=member_timeout_ms,
            rebalance_interval_ms=rebalance_interval_ms,
            commit_interval_ms=commit_interval_ms,
            pull_suspend_ms=pull_suspend_ms,
            lock_ttl_ms=lock_ttl_ms,
            relock_interval_ms=relock_interval_ms,
            suspend_current_queue_ms=suspend_current_queue_ms,
        )
        self.consume_from_timestamp_ms = settings.consume_from_timestamp_ms
        self._max_reconsume_setting = settings.max_reconsume_setting
        self._settings = settings
        self.pull_batch_size = settings.pull_batch_size
        self.consume_message_batch_max_size = settings.consume_batch_size
        self._heartbeat_s = settings.heartbeat_s
        self._rebalance_s = settings.rebalance_s
        self._commit_s = settings.commit_s
        self._pull_suspend_ms = settings.pull_suspend_ms
        self._relock_s = settings.relock_s
        self._suspend_s = settings.suspend_s
        if instance_id is None:
            # RocketMQ: a clustering instance gets a unique name (pid#time); a broadcasting one keeps
            # ip@DEFAULT, so a restart on the same host finds its offsets.
            broadcast = self.model is MessageModel.BROADCASTING
            instance_id = host_client_id() if broadcast else default_consumer_id()
        self.instance_id = instance_id
        self._store = store
        self._membership = GroupMembership(
            store,
            self.group,
            self.instance_id,
            model=self.model,
            member_timeout_ms=member_timeout_ms,
            lock_ttl_ms=lock_ttl_ms,
        )
        broadcasting = self.model is MessageModel.BROADCASTING
        self._offsets = OffsetStore(store, self.group, self.instance_id if broadcasting else "")
        self._actions = ActionLogWriter(store, self.group, self.instance_id)
        self._puller = PullConsumer(store, self.group)
        self._index = QueueIndex(store)
        self._subscriptions: dict[str, MessageSelector] = {}
        self._listener: ListenerCall | None = None
        self._orderly = False
        self._pqs: dict[MessageQueue, ProcessQueue] = {}
        self._state_lock = threading.RLock()  # guards _pqs, _subscriptions and the lifecycle
        self._persist_lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._started = False
        self._closed = False
        self._last_relock: float | None = None  # monotonic time of the last renewal of every lock
        self._resets: LiveResets | None = None  # set by start()
        self._setup: ConsumeSetup | None = None  # set by start()
        self._consume: ConsumeService | None = None  # set by start()

    # ----------------------------------------------------------------- setup
    @property
    def consumer_id(self) -> str:
        return self.instance_id

    @property
    def max_reconsume_times(self) -> int:
        """Failures after which a message goes to ``%DLQ%<group>``. The default (-1), as RocketMQ's:
        the engine's ``max_reconsume_times`` (16) for a concurrent listener, no limit for an orderly
        one (its failing message is retried in place, so the queue's order holds)."""
        if self._max_reconsume_setting != -1:
            return self._max_reconsume_setting
        return UNLIMITED_RECONSUME if self._orderly else self._store.config.max_reconsume_times

    def subscribe(self, topic: str, expression: MessageSelector | str = "*") -> None:
        """Consume ``topic`` messages matching a :class:`MessageSelector` or a tag expression string.

        A clustering consumer also subscribes the group's retry topic ``%RETRY%<group>`` (``"*"``),
        created if missing, as RocketMQ does. Subscribing again replaces the selector.

        Raises:
            InvalidTopicError, TopicNotFoundError: a bad or unknown topic.
            InvalidSelectorError: a bad expression (parsed here, once).
            ConsumerError: the consumer was shut down.
        """
        self._check_open()
        validate_topic_name(topic)
        self._store.topic(topic)
        selector = MessageSelector.of(expression)
        with self._state_lock:
            self._check_open()
            if self.model is MessageModel.CLUSTERING:
                retry = retry_topic(self.group)
                Admin(self._store).ensure_system_topic(retry)
                self._subscriptions[retry] = MessageSelector.by_tag("*")
            self._subscriptions[topic] = selector

    def subscriptions(self) -> dict[str, str]:
        """Subscribed topics and their expressions (the retry topic included); a SQL92 selector
        shows as ``"SQL92: <expression>"``."""
        with self._state_lock:
            return {topic: str(selector) for topic, selector in self._subscriptions.items()}

    def selectors(self) -> dict[str, MessageSelector]:
        """Subscribed topics and their selectors (the retry topic included)."""
        with self._state_lock:
            return dict(self._subscriptions)

    def register_listener(
        self,
        listener: Listener | MessageListener,
        orderly: bool = False,
        *,
        with_context: bool | None = None,
    ) -> None:
        """Set the function called with each batch of messages; it returns a :class:`ConsumeResult`.

        ``listener(messages)``, or, to also get a :class:`ConsumeConcurrentlyContext` (choose the
        next retry delay) or a :class:`ConsumeOrderlyContext` (choose the pause), a listener that
        asks for the context unmistakably: ``listener(messages, context)`` with ``context``
        required (no default), an object with RocketMQ's ``consume_message(messages, context)``
        (:class:`~engine.client.push.listener.MessageListener`), or any callable registered with
        ``with_context=True``. A second parameter with a default (``lambda msgs, i=i: ...``, the
        usual way to bind a loop variable) or ``*args`` gets no context; ``with_context=False``
        never passes one.

        A concurrent listener is called from the consume pool (``consume_thread_max`` threads at
        most), several batches of one queue at once, and must be thread-safe; a failed
        (RECONSUME_LATER or raising) batch is recorded as NACKs and redelivered later through the
        retry topic. An orderly listener sees each queue's messages in queue order, one batch at a
        time, only while this instance holds the queue's lock; a failed batch
        (SUSPEND_CURRENT_QUEUE_A_MOMENT, RECONSUME_LATER or raising) is retried in place after
        ``suspend_current_queue_ms``, never skipped; only when the user set
        ``max_reconsume_times`` does a message failing more often go to the dead-letter topic.

        Raises:
            InvalidArgumentError: not callable (nor a ``MessageListener``), or ``with_context=True``
                for a listener that cannot take two arguments.
            ConsumerError: the consumer is already started, or was shut down.
        """
        self._check_open()
        call = ListenerCall(listener, self.instance_id, with_context)
        with self._state_lock:
            self._check_open()
            if self._started:
                raise ConsumerError("register the listener before start()", group=self.group)
            self._listener = call
            self._orderly = bool(orderly)

    def start(self) -> PushConsumer:
        """Join the group and start consuming in background threads.

        Raises:
            ConsumerError: no listener, no subscription, already started or shut down.
        """
        with self._state_lock:
            self._check_open()
            if self._started:
                raise ConsumerError("the consumer is already started", group=self.group)
            if self._listener is None:
                raise ConsumerError("register a listener before start()", group=self.group)
            if not any(not t.startswith(RETRY_PREFIX) for t in self._subscriptions):
                raise ConsumerError("subscribe to a topic before start()", group=self.group)
            # Before any queue is started: a reset made from here on is seen by the watcher, one made
            # before is in the committed offsets the queues start from.
            self._resets = LiveResets(ResetWatcher(self._store, self.group))
            self._setup = ConsumeSetup(
                consumer_id=self.instance_id,
                model=self.model,
                orderly=self._orderly,
                uses_locks=self._uses_locks,
                listener=self._listener,
                max_reconsume_times=self.max_reconsume_times,
                job_max_reconsume_times=self._store.config.max_reconsume_times,
                pull_batch_size=self.pull_batch_size,
                consume_batch_size=self.consume_message_batch_max_size,
                consume_thread_min=self._settings.consume_thread_min,
                consume_thread_max=self._settings.consume_thread_max,
                pull_threshold_for_queue=self._settings.pull_threshold_for_queue,
                pull_threshold_bytes_for_queue=self._settings.pull_threshold_bytes_for_queue,
                consume_concurrently_max_span=self._settings.consume_concurrently_max_span,
                consume_timeout_s=self._settings.consume_timeout_s,
                pull_suspend_ms=self._pull_suspend_ms,
                relock_wait_s=min(self._rebalance_s, _RELOCK_WAIT_S),
                suspend_s=self._suspend_s,
                puller=self._puller,
                membership=self._membership,
                actions=self._actions,
                stop=self._stop,
            )
            self._consume = ConsumeService(self._setup, f"push-{self.group}-consume")
            self._membership.heartbeat(self.subscriptions())
            self._started = True
            for name, target in (("service", self._service_loop), ("rebalance", self._rebalance_loop)):
                thread = threading.Thread(target=target, name=f"push-{self.group}-{name}", daemon=True)
                self._threads.append(thread)
                thread.start()
        return self

    def assignment(self) -> list[MessageQueue]:
        """Queues this instance consumes now, sorted."""
        with self._state_lock:
            return sorted(self._pqs)

    def process_queue_info(self) -> dict[MessageQueue, ProcessQueueInfo]:
        """Each assigned queue's cache and offsets now (RocketMQ's ``ProcessQueueInfo`` in a
        consumer's running info): cached messages and bytes, listener calls in flight, how often
        pulling paused for the cache bounds, consumed and committed offsets."""
        with self._state_lock:
            pqs = dict(self._pqs)
        return {mq: pq.info() for mq, pq in sorted(pqs.items())}

    @property
    def consume_threads(self) -> int:
        """Threads of the consume pool alive now (at most ``consume_thread_max``; 0 before start)."""
        return self._consume.pool.threads if self._consume is not None else 0

    @property
    def _uses_locks(self) -> bool:
        # RocketMQ locks queues for orderly clustering only; a broadcasting instance owns every queue.
        return self._orderly and self.model is MessageModel.CLUSTERING

    def _check_open(self) -> None:
        if self._closed:
            raise ConsumerClosedError("the consumer was shut down; create a new one", group=self.group)

    def _warn(self, what: str, exc: Exception) -> None:
        log_failure(self.instance_id, what, exc)

    # ----------------------------------------------------------------- shutdown
    def close(self) -> None:
        """Same as :meth:`shutdown` (leaving ``with`` calls it)."""
        self.shutdown()

    def shutdown(self) -> None:
        """Stop consuming: commit offsets, release locks and leave the group. Idempotent."""
        with self._state_lock:
            if self._closed:
                return
            self._closed = True
            started = self._started
        if not started:
            return
        self._stop.set()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join()
        with self._state_lock:
            pqs = list(self._pqs.values())
        self._drop(pqs)
        if self._consume is not None:
            self._consume.shutdown()
        try:
            self._persist()
            self._actions.close()
        except Exception as exc:  # logged; background work goes on
            self._warn("final commit failed", exc)
        try:
            self._membership.leave()
        except Exception as exc:  # logged; background work goes on
            self._warn("leave failed", exc)

    # ----------------------------------------------------------------- background
    def _service_loop(self) -> None:
        next_heartbeat = time.monotonic() + self._heartbeat_s
        next_commit = time.monotonic() + self._commit_s
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_heartbeat:
                next_heartbeat = now + self._heartbeat_s
                try:
                    self._membership.heartbeat(self.subscriptions())
                except Exception as exc:  # logged; background work goes on
                    self._warn("heartbeat failed", exc)
            if now >= next_commit:
                next_commit = now + self._commit_s
                try:
                    self._persist()
                except Exception as exc:  # logged; background work goes on
                    self._warn("offset commit failed", exc)
            else:
                try:
                    self._actions.flush_if_due()
                except Exception as exc:  # logged; background work goes on
                    self._warn("action flush failed", exc)
            try:
                self._expire_stuck()
            except Exception as exc:  # logged; background work goes on
                self._warn("sending back messages past consume_timeout failed", exc)
            wake = min(next_heartbeat, next_commit, time.monotonic() + _ACTION_FLUSH_S)
            self._stop.wait(max(0.0, wake - time.monotonic()))

    def _expire_stuck(self) -> None:
        """Send back messages inside a listener call for longer than ``consume_timeout``."""
        if self._consume is None:
            return
        with self._state_lock:
            pqs = list(self._pqs.values())
        self._consume.expire(pqs)

    def _rebalance_loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._rebalance()
            except Exception as exc:  # logged; background work goes on
                self._warn("rebalance failed", exc)
            try:
                self._apply_resets()
            except Exception as exc:  # logged; background work goes on
                self._warn("applying an offset reset failed", exc)
            self._stop.wait(self._rebalance_s)

    def _rebalance(self) -> None:
        """One round of RocketMQ's ``RebalanceImpl.doRebalance``."""
        subscriptions = self.selectors()
        members: list[str] = []
        if self.model is MessageModel.CLUSTERING:
            members = self._membership.live_members()
            if self.instance_id not in members:
                members.append(self.instance_id)  # alive by definition; our heartbeat may lag
        topics = self._store.topic_configs(refresh=True)
        target: dict[MessageQueue, MessageSelector] = {}
        for topic, expression in subscriptions.items():
            config = topics.get(topic)
            if config is None:
                continue
            queues = [MessageQueue(topic, i) for i in range(config.queues)]
            mine = (
                queues
                if self.model is MessageModel.BROADCASTING
                else self._allocate(queues, members, self.instance_id)
            )
            for mq in mine:
                target[mq] = expression
        with self._state_lock:
            current = dict(self._pqs)
        removed = [pq for mq, pq in current.items() if mq not in target]
        changed = [pq for mq, pq in current.items() if mq in target and target[mq] != pq.expression]
        for pq in changed:
            pq.reselect(target[pq.mq])  # a new expression applies from the next pull
        if removed:
            self._drop(removed)
        added = sorted(mq for mq in target if mq not in current)
        if self._uses_locks:
            # None: never renewed yet. Not 0.0: time.monotonic() is about the machine's uptime, so on
            # a freshly booted machine "long ago" would still be too recent.
            relock = self._last_relock is None or time.monotonic() - self._last_relock >= self._relock_s
            kept = [mq for mq in current if mq in target]
            asked = added + (kept if relock else [mq for mq in kept if not self._membership.is_locked(mq)])
            if relock:
                self._last_relock = time.monotonic()
            granted = self._membership.lock(asked) if asked else set()
            added = [mq for mq in added if mq in granted]  # the others are retried next round
            lost = [current[mq] for mq in kept if mq in asked and mq not in granted]
            if lost:
                # Another member holds it now: forget our progress (its offsets are the truth) and
                # start again from the committed offset once the lock comes back.
                self._drop(lost, commit=False)
        if added and not self._stop.is_set():
            self._start_queues(added, target)

    def _start_queues(
        self,
        added: Sequence[MessageQueue],
        target: dict[MessageQueue, MessageSelector],
        known: dict[tuple[str, int], int] | None = None,
    ) -> None:
        """Start workers for queues, from their committed offsets (``known``: offsets just
        committed by this instance, used as they are)."""
        committed: dict[tuple[str, int], int] = {}
        for topic in sorted({mq.topic for mq in added}):
            committed.update(self._offsets.read(topic))
        committed.update(known or {})
        pqs = []
        initial = []
        for mq in added:
            offset = committed.get((mq.topic, mq.queue_id))
            if offset is None:
                offset = self._initial_offset(mq)
                initial.append((mq.topic, mq.queue_id, offset))
            pq = ProcessQueue(mq, target[mq], offset, committed.get((mq.topic, mq.queue_id)))
            pqs.append(pq)
        if initial:
            # Fix "first sight" now, so a queue moving on before it is consumed does not skip ahead.
            self._offsets.commit(initial)
            by_mq = {MessageQueue(t, q): o for t, q, o in initial}
            for pq in pqs:
                if pq.mq in by_mq:
                    pq.mark_committed(by_mq[pq.mq])
        with self._state_lock:
            if self._stop.is_set():
                return
            assert self._setup is not None  # queues start once the consumer has started
            assert self._consume is not None
            for pq in pqs:
                self._pqs[pq.mq] = pq
                loop = functools.partial(pull_loop, pq, self._setup, self._consume)
                pq.start(loop, f"push-{self.group}-{pq.mq.topic}-{pq.mq.queue_id}")

    def _initial_offset(self, mq: MessageQueue) -> int:
        """RocketMQ's ``computePullFromWhere`` for a queue without a committed offset: LAST starts
        a young queue (first message still "in memory") at 0, as the broker's answer does."""
        self._index.refresh()
        if mq.topic.startswith(RETRY_PREFIX):
            return self._index.bounds(mq.topic, mq.queue_id)[0]  # a group's retries are never skipped
        return start_offset(
            self._index,
            mq.topic,
            mq.queue_id,
            self.consume_from,
            timestamp_ms=self.consume_from_timestamp_ms,
            store=self._store,
            pop=False,
        )

    def _drop(self, pqs: Sequence[ProcessQueue], *, commit: bool = True) -> None:
        """Stop consuming queues: stop their pulls, give their listener calls in flight up to
        ``await_termination_ms_when_shutdown`` to return, abandon what still runs, commit (unless
        ``commit`` is False), then unlock the queues no call runs on any more."""
        for pq in pqs:
            pq.drop()
        deadline = time.monotonic() + self._settings.await_termination_s
        idle = {pq.mq for pq in pqs if pq.wait_idle(max(0.0, deadline - time.monotonic()))}
        for pq in pqs:
            pq.abandon()
        # A pull thread ends within its long poll once its queue is dropped; it adds nothing after.
        pull_deadline = time.monotonic() + max(1.0, 2 * self._pull_suspend_ms / 1000)
        for pq in pqs:
            if not pq.join_puller(max(0.0, pull_deadline - time.monotonic())):
                _log.warning("push consumer %s: the pull of %s did not end in time", self.instance_id, pq.mq)
        try:
            if commit:
                self._persist(pqs)
        finally:
            with self._state_lock:
                for pq in pqs:
                    if self._pqs.get(pq.mq) is pq:
                        del self._pqs[pq.mq]
        finished = [pq.mq for pq in pqs if pq.mq in idle]
        if self._uses_locks and finished and commit:
            # A listener still running keeps its lock until the lease expires.
            try:
                self._membership.unlock(finished)
            except Exception as exc:  # logged; background work goes on
                self._warn("unlock failed (leases expire)", exc)

    def _persist(self, pqs: Sequence[ProcessQueue] | None = None) -> None:
        """Commit consumed offsets that moved; NACKs of the messages they pass are flushed first."""
        with self._persist_lock:
            if pqs is None:
                with self._state_lock:
                    pqs = list(self._pqs.values())
            # Read offsets before flushing: a worker records a NACK before moving its offset. A queue
            # reset but not resumed yet keeps the reset: its old progress is never committed.
            reset = self._resets.pending() if self._resets is not None else {}
            snapshot = [
                (pq, pq.consumed)
                for pq in pqs
                if pq.consumed != pq.committed and (pq.mq.topic, pq.mq.queue_id) not in reset
            ]
            self._actions.flush()
            if not snapshot:
                return
            self._offsets.commit([(pq.mq.topic, pq.mq.queue_id, offset) for pq, offset in snapshot])
            for pq, offset in snapshot:
                pq.mark_committed(offset)

    def _apply_resets(self) -> None:
        """Resume every held queue that was reset from its new offset (the rebalance thread only, so
        no rebalance round starts or drops a queue meanwhile).

        The queue's worker is stopped and its progress forgotten (nothing of it is committed), the
        reset offset is committed again by this instance (a commit of ours that raced the reset
        cannot leave the old offset standing), and a new worker starts from it. An orderly
        consumer keeps the queue's lock throughout.
        """
        if self._resets is None:
            return
        pending = self._resets.pending()
        if not pending:
            return
        with self._state_lock:
            held = {mq: pq for mq, pq in self._pqs.items() if (mq.topic, mq.queue_id) in pending}
        with self._persist_lock:  # no periodic commit of the old progress in between
            if held:
                self._drop(list(held.values()), commit=False)
                self._offsets.commit(
                    [(mq.topic, mq.queue_id, pending[(mq.topic, mq.queue_id)]) for mq in held]
                )
            self._resets.applied(pending)
        if held and not self._stop.is_set():
            _log.info("push consumer %s: offsets reset for %s", self.instance_id, sorted(held))
            offsets = {(mq.topic, mq.queue_id): pending[(mq.topic, mq.queue_id)] for mq in held}
            selectors = {mq: MessageSelector.of(pq.expression) for mq, pq in held.items()}
            self._start_queues(sorted(held), selectors, offsets)
