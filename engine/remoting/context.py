"""What the request handlers share: the store, the engine's clients, the connected clients."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

from engine.client.membership import GroupMembership
from engine.client.producer import DOOR_REGROUP_MS
from engine.client.pull import PullConsumer
from engine.config import SYNC_FLUSH
from engine.protocol.names import retry_topic
from engine.protocol.rebalance import MessageModel
from engine.protocol.topics import system_topic_config
from engine.remoting.frames import RemotingCommand, encode_command
from engine.remoting.landing import Landings
from engine.remoting.loop_commits import LOOP_LOCK_WAIT_S, LoopCommits
from engine.remoting.offsets_batch import OffsetBatcher
from engine.remoting.pull_hold import PullHold
from engine.remoting.put_stats import PutStats
from engine.remoting.recent import RecentMessages
from engine.remoting.reset_push import ResetTracker
from engine.remoting.wire_producer import WireProducer
from engine.store.action_log import ActionLogWriter
from engine.store.commit_log import LOCK_WAIT_S
from engine.store.consume_queue import QueueIndex
from engine.store.store import Store, now_ms

T = TypeVar("T")

# Java clients heartbeat every 30 s; RocketMQ's broker drops a silent channel after 120 s.
WIRE_MEMBER_TIMEOUT_MS = 120_000
BROKER_NAME = "lakemq-broker-a"


@dataclass(eq=False)
class Connection:
    """One client connection: where to write, and which clients and groups spoke over it."""

    peer: str
    writer: asyncio.StreamWriter
    client_ids: set[str] = field(default_factory=set)
    producer_groups: set[str] = field(default_factory=set)
    consumer_groups: dict[str, str] = field(default_factory=dict)  # group -> client id
    # frames for the write at the loop's next turn (:meth:`send`)
    _out: list[bytes] = field(default_factory=list, init=False, repr=False)

    @functools.cached_property
    def address(self) -> tuple[str, int] | None:
        """The client's end of the connection, (ip, port); None on a socket with no such address."""
        peer = self.writer.get_extra_info("peername")
        return (str(peer[0]), int(peer[1])) if isinstance(peer, tuple) and len(peer) >= 2 else None

    async def send(self, cmd: RemotingCommand) -> None:
        """Write one frame: at the loop's next turn, with the other frames sent over this connection
        in this turn, in one write (the responses of one group commit, resumed together, cost the
        server one system call instead of one each; frames are whole and in order). Waits while
        the client reads slower than the server writes.

        Raises:
            ConnectionResetError: the connection is closed or closing.
        """
        if self.writer.transport.is_closing():
            raise ConnectionResetError(f"connection to {self.peer} lost")
        if not self._out:
            asyncio.get_running_loop().call_soon(self.flush)
        self._out.append(encode_command(cmd))
        await self.writer.drain()

    def flush(self) -> None:
        """Write the frames :meth:`send` queued now (before the connection is closed)."""
        frames, self._out = self._out, []
        if frames and not self.writer.transport.is_closing():  # (a failed write closes it)
            self.writer.write(frames[0] if len(frames) == 1 else b"".join(frames))


class BrokerContext:
    """State shared by the broker's handlers; engine calls run on its thread pools.

    Args:
        store: the store served.
        host, port: the broker address clients are told (route data, message ids).
        auto_create_topics: a send to a missing topic creates it (through the template topic's
            route), as RocketMQ's ``autoCreateTopicEnable`` (on by default there and here).
        workers: threads for ordinary requests, and as many for pulls.
    """

    def __init__(
        self, store: Store, host: str, port: int, *, auto_create_topics: bool = True, workers: int = 8
    ) -> None:
        self.store = store
        self.host = host
        self.port = port
        self.auto_create_topics = auto_create_topics
        self.executor = ThreadPoolExecutor(workers, thread_name_prefix="mq-remoting")
        # Pulls read on threads of their own, so a slow read never holds up sends; a parked pull
        # holds no thread (:class:`~engine.remoting.pull_hold.PullHold`).
        self.pull_executor = ThreadPoolExecutor(workers, thread_name_prefix="mq-remoting-pull")
        # No linger: a send waits only for the commit in progress; the sends that arrive meanwhile
        # make up the next commit (a group commit), so one client alone is not slowed down. The
        # threads of a synchronous client, acknowledged together, are gathered again for a moment.
        # On a local disk (async flush) sends are committed on the event loop itself
        # (engine.remoting.loop_commits), which waits for the host lock only briefly; elsewhere by
        # the producer's worker thread.
        on_loop = store.is_local and store.config.flush_disk_type != SYNC_FLUSH
        self.producer = WireProducer(
            store,
            "LAKEMQ_WIRE",
            linger_ms=0,
            regroup_ms=DOOR_REGROUP_MS,
            lock_wait_s=LOOP_LOCK_WAIT_S if on_loop else LOCK_WAIT_S,
        )
        # The sends of one group commit wake the event loop once, not once each.
        self.landings = Landings()
        self.commits = (
            LoopCommits(
                self.producer.commit_groups,
                regroup_ms=DOOR_REGROUP_MS,
                batch_size=store.config.producer_batch_size,
                max_bytes=store.config.max_batch_bytes,
            )
            if on_loop
            else None
        )
        # One index for the door's every read (pulls of all groups, parked pulls, look-ups): each new
        # version of the queues is read once, not once per group.
        self.index = QueueIndex(store)
        self.hold = PullHold(self.index, self.run, store.config.long_poll_interval_ms / 1000)
        # Recent messages in their wire encoding; the event loop's alone (engine.remoting.recent).
        self.recent = RecentMessages(store.config.wire_recent_bytes, store.config)
        self.offsets = OffsetBatcher(store)
        self.put_stats = PutStats()  # how long the sends' puts took (brokerStatus's putMessage rows)
        self.resets = ResetTracker(store)
        self.connections: set[Connection] = set()
        self.subscriptions: dict[str, dict[str, tuple[str, str]]] = {}  # group -> topic -> (expr, type)
        self._lock = threading.Lock()
        self._pullers: dict[str, PullConsumer] = {}
        self._members: dict[tuple[str, str], GroupMembership] = {}
        self._actions: dict[str, ActionLogWriter] = {}
        self._ensured: set[str] = set()
        # Topics a send found or created; only the event loop reads and writes it.
        self.sent_topics: set[str] = set()

    @property
    def address(self) -> str:
        """``host:port`` of the broker endpoint."""
        return f"{self.host}:{self.port}"

    async def run(self, fn: Callable[..., T], *args: object, pull: bool = False) -> T:
        """Run a blocking engine call on a worker thread."""
        loop = asyncio.get_running_loop()
        pool = self.pull_executor if pull else self.executor
        return await loop.run_in_executor(pool, functools.partial(fn, *args))

    def puller(self, group: str) -> PullConsumer:
        """The engine's pull consumer of ``group`` (one per group, thread-safe)."""
        with self._lock:
            consumer = self._pullers.get(group)
            if consumer is None:
                consumer = self._pullers[group] = PullConsumer(self.store, group, index=self.index)
            return consumer

    def membership(
        self, group: str, client_id: str, model: MessageModel = MessageModel.CLUSTERING
    ) -> GroupMembership:
        """The engine's membership of one wire client in ``group``."""
        key = (group, client_id)
        with self._lock:
            member = self._members.get(key)
            if member is None or member.model is not model:
                member = self._members[key] = GroupMembership(
                    self.store, group, client_id, model=model, member_timeout_ms=WIRE_MEMBER_TIMEOUT_MS
                )
            return member

    def forget_member(self, group: str, client_id: str) -> GroupMembership | None:
        """Drop a client's membership object (after it left); the one dropped, if any."""
        with self._lock:
            return self._members.pop((group, client_id), None)

    def actions(self, group: str) -> ActionLogWriter:
        """The action-log writer that records this endpoint's NACKs (send-backs) for ``group``."""
        with self._lock:
            writer = self._actions.get(group)
            if writer is None:
                writer = self._actions[group] = ActionLogWriter(self.store, group, f"wire@{self.address}")
            return writer

    def ensure_retry_topic(self, group: str) -> None:
        """Create ``%RETRY%<group>`` if missing, as RocketMQ's broker does on a consumer's heartbeat."""
        name = retry_topic(group)
        if name in self._ensured:
            return
        if (
            self.store.topic_configs().get(name) is None
            and self.store.topic_configs(refresh=True).get(name) is None
        ):
            self.store.put_topic(system_topic_config(name, now_ms()))
        self._ensured.add(name)

    def report_offset(self, group: str, topic: str, queue_id: int, offset: int) -> bool:
        """A client's consumer offset, kept for the next flush unless a reset guards its queue
        (see :mod:`engine.remoting.reset_push`); False when it was not kept.

        Raises:
            TopicNotFoundError: no such topic.
            InvalidArgumentError: a bad group, queue id or offset.
        """
        if not self.resets.admits(group, topic, queue_id, offset):
            return False
        return self.offsets.put(group, topic, queue_id, offset)

    async def keep_offset(self, group: str, topic: str, queue_id: int, offset: int) -> bool:
        """:meth:`report_offset`, in the order the reports arrive: on the event loop when keeping
        it touches no file (a known topic of a local store), without a thread hop; elsewhere on a
        worker thread. Through the worker threads two reports of one queue could be kept in either
        order, and a Java consumer reports its queues back to back (the reset offsets it followed,
        then its progress), so the older could win.

        Raises:
            As :meth:`report_offset`.
        """
        if self.store.is_local and topic in self.store.topic_configs():
            return self.report_offset(group, topic, queue_id, offset)
        return await self.run(self.report_offset, group, topic, queue_id, offset)

    def producers_of(self, group: str) -> list[Connection]:
        """Connections over which a producer of ``group`` registered."""
        return [c for c in self.connections if group in c.producer_groups]

    def close(self) -> None:
        """Flush what is buffered (offsets, send-backs) and stop the worker threads."""
        with contextlib.suppress(Exception):  # closing must not fail the shutdown
            self.offsets.flush()
        for writer in list(self._actions.values()):
            with contextlib.suppress(Exception):  # closing must not fail the shutdown
                writer.close()
        self.producer.close()
        self.executor.shutdown(wait=True, cancel_futures=True)
        self.pull_executor.shutdown(wait=False, cancel_futures=True)


Handler = Callable[[BrokerContext, Connection, RemotingCommand], Awaitable[RemotingCommand | None]]
"""A request handler: the shared context, the connection, the request; returns the response."""
