"""RocketMQ 5's ``MessagingService`` over the store, on ``grpc.aio`` on a thread of its own.

What it answers, as RocketMQ 5's proxy does:

* ``QueryRoute``: every queue of the topic, readable and writable as the topic is, on this one
  endpoint; ``TOPIC_NOT_FOUND`` for a missing topic. ``QueryAssignment``: the topic as one
  assignment (queue -1: receives take from every queue, as the proxy's POP mode).
* ``Telemetry``: the client's settings, answered with the server's (producer: retry policy, largest
  body; consumer: batch size, long polling, max attempts) — the 5.x clients' start-up waits for it;
  settings with neither publishing nor subscription end the stream ``INVALID_ARGUMENT``, as the
  proxy's. The stream stays open for what the server sends (:mod:`engine.grpc.telemetry`):
  transaction check-backs, and thread-stack and verify commands (:meth:`GrpcServer.ask`) whose
  answers come back on it.
* ``Heartbeat``; ``NotifyClientTermination`` closes the client's consumer of the group (what it
  leased and never handed out is given back; what it received becomes visible at its deadline).
* ``SendMessage``: normal, delay/timer (a delivery timestamp) and FIFO-keyed sends (a message group
  chooses the queue, as RocketMQ 5's Python client does, and is stored with the message) through
  the engine's producer, one result per message (``MULTIPLE_RESULTS`` when they differ).
  Transactional ones, ``EndTransaction`` and the check-back: :mod:`engine.grpc.transactions`.
* ``ReceiveMessage``, ``AckMessage``, ``ChangeInvisibleDuration``: per-message leases of
  :class:`~engine.client.simple.SimpleConsumer`, one per (group, client id); the long polling and the
  invisible time are checked and clamped as the proxy does (:mod:`engine.protocol.rocketmq5`).
  A FIFO group (``Admin.update_group(group, fifo=True)``) is told ``subscription.fifo`` in its
  settings and receives each queue in order, the next only after the previous is acked or
  dead-lettered; messages carry their ``message_group`` back.
  Receipt handles carry group, client, topic, queue, offset and the lease
  (:class:`~engine.protocol.rocketmq5.ReceiptHandle`); a stale one is ``INVALID_RECEIPT_HANDLE``.
  A group new to a queue starts where RocketMQ 5's POP starts it (the proxy's init mode MAX): at
  the queue's last message, or at its first while the queue is young (RocketMQ's "offset 0 still
  in memory", :func:`~engine.client.offsets.is_young`); a retry topic from its first message.
  A handle works on every door over the store: one another door gave out is adopted from the
  action log while it is its client's live lease (:meth:`SimpleConsumer.adopt`).
  ``ForwardMessageToDeadLetterQueue`` gives a received message up at once: the engine's retry job
  puts it in ``%DLQ%<group>`` as it does one not acked after the settings' ``max_attempts``.

Bad input gets RocketMQ 5's code in the answer's status (:mod:`engine.grpc.statuses`; a request
whose bytes are not its protobuf message: :mod:`engine.grpc.unparsable`) and writes nothing;
nothing a client sends stops the server. The calls themselves: :mod:`engine.grpc.service`; this
module holds the door's lifecycle, its clients and consumers, and the engine calls they make.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from grpc import aio

from engine.client.offsets import ConsumeFrom
from engine.client.producer import DOOR_REGROUP_MS, Producer
from engine.client.sending import PreparedSend
from engine.client.simple import MAX_RECEIVE_NUMS, ReceivedMessage, SimpleConsumer
from engine.errors import InvalidArgumentError, InvalidReceiptHandleError, InvalidTopicError, MQError
from engine.grpc.messages import ACCEPTED_TYPES, IncomingMessage, from_proto
from engine.grpc.service import LITE_CLIENTS, Service
from engine.grpc.telemetry import Streams
from engine.grpc.transactions import Transactions
from engine.grpc.unparsable import Guarded
from engine.grpc.v2 import definition_pb2 as pb
from engine.grpc.v2 import service_pb2 as spb
from engine.grpc.v2 import service_pb2_grpc as spb_grpc
from engine.model import SendResult
from engine.protocol.names import is_system_topic
from engine.protocol.permissions import is_readable, is_writeable
from engine.protocol.rocketmq5 import MAX_BODY_BYTES, MAX_LONG_POLLING_MS, ReceiptHandle, client_queue
from engine.protocol.selectors import MessageSelector
from engine.protocol.topics import TopicConfig
from engine.protocol.transactions import HalfMessage
from engine.remoting.framing import LoopThread
from engine.store.group_configs import group_config
from engine.store.store import Store, now_ms

T = TypeVar("T")
BROKER_NAME = "lakemq"
DEFAULT_PORT = 8081  # RocketMQ 5 proxy's gRPC port
RECEIVE_BATCH_SIZE = 32  # the proxy's grpcClientConsumerLongPollingBatchSize
PRODUCER_MAX_ATTEMPTS = 3
MAX_INBOUND_BYTES = 130 * 1024 * 1024
SWEEP_INTERVAL_S = 30.0
CLIENT_IDLE_MS = 120_000  # a client silent this long (12 heartbeats missed) is gone
NACK_INVISIBLE_MS = 1000  # the proxy's NACK_INVISIBLE_TIME for messages a client never got
MAX_LITE_TOPIC_SIZE = 64  # the client's default


@dataclass
class _Consumer:
    """The door's state of one client of one consumer group."""

    consumer: SimpleConsumer
    held: dict[tuple[str, int, int], ReceivedMessage] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class ClientState:
    """What the door knows of one 5.x client (by its ``x-mq-client-id``)."""

    client_id: str
    settings: pb.Settings | None = None
    last_seen_ms: int = 0


class GrpcServer:
    """RocketMQ 5's gRPC ``MessagingService`` over a store.

    Args:
        store: the store served.
        host: the address bound (127.0.0.1 unless told otherwise).
        port: the port (0: any free port; see :attr:`port` after start).
        advertised_host: the host clients are told in routes (default ``host``).
        max_workers: threads that run the engine's blocking calls (receives wait on their own pool).

    Raises:
        InvalidArgumentError: a port outside 0..65535.
    """

    def __init__(
        self,
        store: Store,
        *,
        host: str = "127.0.0.1",
        port: int = DEFAULT_PORT,
        advertised_host: str | None = None,
        max_workers: int = 8,
    ) -> None:
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise InvalidArgumentError(f"port {port!r} must be an int in 0..65535", port=port)
        self.store = store
        self.host = host
        self.port = port
        self.advertised_host = advertised_host or host
        self.producer = Producer(store, "GRPC_DOOR", linger_ms=0, regroup_ms=DOOR_REGROUP_MS)
        self.clients: dict[str, ClientState] = {}
        self._consumers: dict[tuple[str, str], _Consumer] = {}
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(max_workers, thread_name_prefix="mq-grpc")
        self._receive_executor = ThreadPoolExecutor(64, thread_name_prefix="mq-grpc-receive")
        self.streams = Streams()
        self.transactions = Transactions(self)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._serving = LoopThread("mq-grpc", self._main)

    # ----------------------------------------------------------------- lifecycle
    def start(self) -> GrpcServer:
        """Bind the port and serve on a background thread; returns once bound.

        Raises:
            OSError: the port could not be bound.
        """
        try:
            self._serving.start()
        except BaseException:
            self._close_engine()
            raise
        return self

    def stop(self, timeout: float = 30) -> None:
        """Stop serving (calls under way get a second to end), then close the consumers."""
        self._serving.stop(timeout)
        self._close_engine()

    def _close_engine(self) -> None:
        with self._lock:
            consumers = list(self._consumers.values())
            self._consumers.clear()
        for state in consumers:
            with contextlib.suppress(Exception):  # closing must not fail the shutdown
                state.consumer.close()
        self.producer.close()
        self._executor.shutdown(wait=True, cancel_futures=True)
        self._receive_executor.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> GrpcServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def address(self) -> str:
        """``host:port`` clients are configured with (their ``endpoints``)."""
        return f"{self.advertised_host}:{self.port}"

    async def _main(self) -> None:
        stopped = self._serving.stopped
        assert stopped is not None
        # As the proxy (grpcMaxInboundMessageSize): a batch of large bodies fits, and a body too
        # large is answered MESSAGE_BODY_TOO_LARGE rather than cut off by the transport.
        server = aio.server(
            options=[
                ("grpc.max_receive_message_length", MAX_INBOUND_BYTES),
                ("grpc.max_send_message_length", MAX_INBOUND_BYTES),
            ]
        )
        spb_grpc.add_MessagingServiceServicer_to_server(Service(self), Guarded(server))  # type: ignore[no-untyped-call]
        bound = server.add_insecure_port(f"{self.host}:{self.port}")
        if bound == 0:
            raise OSError(f"could not bind {self.host}:{self.port}")
        self.port = bound
        await server.start()
        self._loop = asyncio.get_running_loop()
        self._serving.ready()
        tasks = [
            asyncio.create_task(self._sweep_loop()),
            asyncio.create_task(self.transactions.check_back_loop()),
        ]
        try:
            await stopped.wait()
        finally:
            for task in tasks:
                task.cancel()
            await server.stop(grace=1.0)

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_INTERVAL_S)
            with contextlib.suppress(Exception):  # the next round tries again
                await self.call(self.sweep, now_ms())

    # ----------------------------------------------------------------- state
    async def call(self, fn: Callable[..., T], *args: object) -> T:
        """``fn(*args)`` on the door's threads (the engine's calls block; receives, which wait,
        have threads of their own: :meth:`submit_receive`)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args))

    def ask(
        self, client_id: str, command: spb.TelemetryCommand, timeout_s: float = 10.0
    ) -> spb.TelemetryCommand:
        """Send a client a thread-stack or verify command on its Telemetry stream and wait for its
        answer (from any thread but the door's), as RocketMQ's admin asks through the proxy.

        Raises:
            InvalidArgumentError: no open stream of that client (``NOT_FOUND``), no answer in
                ``timeout_s`` (``PROXY_TIMEOUT``), not such a command (``BAD_REQUEST``), or the
                door is not serving.
        """
        loop = self._loop
        if loop is None or loop.is_closed():
            raise InvalidArgumentError("the gRPC door is not serving", status="NOT_FOUND")
        future = asyncio.run_coroutine_threadsafe(self.streams.ask(client_id, command, timeout_s), loop)
        return future.result(timeout_s + 5)

    def client(self, client_id: str) -> ClientState:
        with self._lock:
            state = self.clients.get(client_id)
            if state is None:
                state = self.clients[client_id] = ClientState(client_id)
            state.last_seen_ms = now_ms()
            return state

    def consumer(self, group: str, client_id: str) -> _Consumer:
        """The door's consumer of ``group`` for one client (made on first use; a client that comes
        back with its id gets back what it held)."""
        key = (group, client_id)
        with self._lock:
            found = self._consumers.get(key)
            if found is None:
                consumer = SimpleConsumer(
                    self.store, group, f"grpc:{client_id}", consume_from=ConsumeFrom.LAST
                )
                found = self._consumers[key] = _Consumer(consumer)
            return found

    def sweep(self, now: int) -> int:
        """Forget clients silent for ``CLIENT_IDLE_MS`` (the 5.x clients heartbeat every 10 s) and
        close their consumers, as if they had said goodbye; returns the consumers closed."""
        with self._lock:
            gone = {c for c, state in self.clients.items() if now - state.last_seen_ms >= CLIENT_IDLE_MS}
            for client_id in gone:
                del self.clients[client_id]
            keys = [k for k in self._consumers if k[1] in gone or k[1] not in self.clients]
        return sum(self.forget_consumer(group, client_id) for group, client_id in keys)

    def forget_client(self, client_id: str) -> None:
        """Forget a client (its termination)."""
        with self._lock:
            self.clients.pop(client_id, None)

    def consumer_keys(self) -> list[tuple[str, str]]:
        """(group, client id) of the consumers the door holds now."""
        with self._lock:
            return sorted(self._consumers)

    def forget_consumer(self, group: str, client_id: str) -> bool:
        """Close one client's consumer of ``group`` (its termination); True if there was one."""
        with self._lock:
            state = self._consumers.pop((group, client_id), None)
        if state is None:
            return False
        state.consumer.close()
        return True

    def topic(self, name: str) -> TopicConfig:
        """A topic clients may use.

        Raises:
            InvalidTopicError: a system topic or a bad name (``ILLEGAL_TOPIC``).
            TopicNotFoundError: no such topic.
        """
        if not name:
            raise InvalidTopicError("topic name is empty")
        if is_system_topic(name) or name.lower().startswith("rmq_sys_"):
            raise InvalidTopicError(f"cannot access system topic {name!r}", topic=name)
        return self.store.topic(name)

    def settings_for(self, settings: pb.Settings) -> pb.Settings:
        """The server's answer to a client's settings (the proxy's merge)."""
        out = pb.Settings()
        out.CopyFrom(settings)
        if settings.client_type == pb.PRODUCER or settings.HasField("publishing"):
            policy = out.backoff_policy
            policy.max_attempts = PRODUCER_MAX_ATTEMPTS
            policy.exponential_backoff.initial.FromMilliseconds(10)
            policy.exponential_backoff.max.FromMilliseconds(1000)
            policy.exponential_backoff.multiplier = 2.0
            out.publishing.max_body_size = MAX_BODY_BYTES
            out.publishing.validate_message_type = True
        if settings.HasField("subscription"):
            out.subscription.receive_batch_size = RECEIVE_BATCH_SIZE
            out.subscription.long_polling_timeout.FromMilliseconds(MAX_LONG_POLLING_MS)
            # A FIFO group (Admin.update_group(group, fifo=True)): its receives follow the FIFO
            # rule (engine.client.simple.leases), which the consumer of the group reads itself.
            group = settings.subscription.group.name if settings.subscription.HasField("group") else ""
            out.subscription.fifo = bool(group) and group_config(self.store, group).fifo
            policy = out.backoff_policy
            policy.max_attempts = self.store.config.max_reconsume_times + 1
            policy.exponential_backoff.initial.FromMilliseconds(1000)
            policy.exponential_backoff.max.FromMilliseconds(2 * 3600 * 1000)
            policy.exponential_backoff.multiplier = 2.0
            if settings.client_type in LITE_CLIENTS:
                out.subscription.lite_subscription_quota = 0
                out.subscription.max_lite_topic_size = MAX_LITE_TOPIC_SIZE
        out.metric.on = False
        return out

    def route_queues(self, config: TopicConfig) -> list[pb.MessageQueue]:
        permission = (
            pb.READ_WRITE
            if is_readable(config.perm) and is_writeable(config.perm)
            else pb.READ
            if is_readable(config.perm)
            else pb.WRITE
            if is_writeable(config.perm)
            else pb.NONE
        )
        queues = []
        for queue_id in range(config.queues):
            queue = pb.MessageQueue(id=queue_id, permission=permission)
            queue.topic.name = config.name
            self.fill_broker(queue.broker)
            queue.accept_message_types.extend(ACCEPTED_TYPES.get(config.type, (pb.NORMAL,)))
            queues.append(queue)
        return queues

    def fill_broker(self, broker: pb.Broker) -> None:
        """Name this door as the broker of a queue clients are told of."""
        broker.name = BROKER_NAME
        broker.id = 0
        broker.endpoints.scheme = pb.IPv4
        broker.endpoints.addresses.add(host=self.advertised_host, port=self.port)

    # ----------------------------------------------------------------- engine calls
    def prepare(self, incoming: IncomingMessage, queue_id: int | None = None) -> PreparedSend:
        """A client's checked message as the engine's producer sends it: to ``queue_id``, the
        queue the client chose (:func:`~engine.protocol.rocketmq5.client_queue`), else to the
        queue of its message group when it has one, else round robin.

        Raises:
            InvalidMessageError, TopicNotFoundError, InvalidArgumentError: bad input.
        """
        return self.producer.prepare(
            incoming.message,
            queue_id,
            # with a queue named, the group stays with the message (incoming.broker_properties)
            message_group=incoming.message_group if queue_id is None else None,
            uniq_key=incoming.uniq_key,
            born_ts_ms=incoming.born_ts_ms,
            broker_properties=incoming.broker_properties or None,
        )

    def send(
        self, request: spb.SendMessageRequest, language: str | None = None
    ) -> list[SendResult | HalfMessage | BaseException]:
        """Check and queue each message for the producer's group commit (a transactional one is
        stored as a half message at once); what each became. ``language``: the client's
        ``x-mq-language`` (whether its messages name their queue)."""
        pending: list[Any] = []
        for message in request.messages:
            try:
                incoming = from_proto(message)
                config = self.topic(incoming.message.topic)
                queue_id = client_queue(language, incoming.queue_id, config.queues)
                if incoming.message_type == pb.TRANSACTION:
                    pending.append(self.transactions.send_half(incoming, queue_id))
                    continue
                pending.append(self.producer.append_async(self.prepare(incoming, queue_id)))
            except Exception as exc:
                pending.append(exc)
        out: list[SendResult | HalfMessage | BaseException] = []
        for item in pending:
            if isinstance(item, BaseException | HalfMessage):
                out.append(item)
                continue
            try:
                out.append(item.result())
            except Exception as exc:
                out.append(exc)
        return out

    def receive(
        self,
        group: str,
        client_id: str,
        topic: str,
        selector: MessageSelector,
        batch: int,
        invisible_ms: int,
        wait_ms: int,
    ) -> list[ReceivedMessage]:
        state = self.consumer(group, client_id)
        consumer = state.consumer
        if str(selector) != consumer.subscriptions.get(topic):
            consumer.subscribe(topic, selector)
        # As the proxy's POP, a receive takes from every queue of the topic it names (and the
        # group's retry topic's messages first sent to it), never another topic's.
        got = consumer.receive(
            batch, invisible_ms, wait_ms=min(wait_ms, self.store.config.long_poll_max_ms), topic=topic
        )
        with state.lock:
            if len(state.held) > 4 * MAX_RECEIVE_NUMS:  # drop what expired
                ts = now_ms()
                for key in [k for k, m in state.held.items() if m.invisible_until_ms <= ts]:
                    del state.held[key]
            for message in got:
                state.held[(message.topic, message.queue_id, message.queue_offset)] = message
        return got

    def submit_receive(
        self,
        group: str,
        client_id: str,
        topic: str,
        selector: MessageSelector,
        batch: int,
        invisible_ms: int,
        wait_ms: int,
    ) -> Future[list[ReceivedMessage]]:
        """:meth:`receive` on the receiving threads."""
        return self._receive_executor.submit(
            self.receive, group, client_id, topic, selector, batch, invisible_ms, wait_ms
        )

    def hand_back(self, group: str, client_id: str, messages: list[ReceivedMessage]) -> int:
        """Make messages received for a client that never got them visible again in
        ``NACK_INVISIBLE_MS`` (the proxy's answer to a failed write); returns how many.

        Best effort: a message that cannot be changed becomes visible at its own deadline."""
        with self._lock:
            state = self._consumers.get((group, client_id))
        if state is None:
            return 0
        done = 0
        for message in messages:
            try:
                changed = state.consumer.change_invisible_time(message, NACK_INVISIBLE_MS)
            except MQError:
                continue
            with state.lock:
                state.held[(changed.topic, changed.queue_id, changed.queue_offset)] = changed
            done += 1
        return done

    def hand_back_soon(self, group: str, client_id: str, messages: list[ReceivedMessage]) -> None:
        """:meth:`hand_back` on the door's threads (not waited for)."""
        with contextlib.suppress(RuntimeError):  # the door is shutting down: deadlines do it
            self._executor.submit(self.hand_back, group, client_id, messages)

    def hand_back_later(self, group: str, client_id: str, receive: Future[list[ReceivedMessage]]) -> None:
        """What a receive the client left found, once it ends: handed back."""
        if not receive.cancelled() and receive.exception() is None:
            got = receive.result()
            if got:
                self.hand_back_soon(group, client_id, got)

    def held(self, group: str, client_id: str, handle: str) -> tuple[_Consumer, ReceivedMessage]:
        """The message a receipt handle names, with the engine's handle it carries.

        Raises:
            InvalidReceiptHandleError: not a handle of this group, or not a live lease of its client.
        """
        parsed = ReceiptHandle.decode(handle)
        if parsed.group != group:
            raise InvalidReceiptHandleError(
                f"receipt handle is of group {parsed.group!r}, not {group!r}", status="INVALID_RECEIPT_HANDLE"
            )
        state = self.consumer(group, parsed.client_id)
        key = (parsed.topic, parsed.queue_id, parsed.offset)
        message = state.held.get(key)
        if message is None or message.receipt_handle != parsed.lease:
            # Received or changed through another door on this store (the client reconnected
            # here with its id, or this door restarted): held here if it is that id's live lease.
            try:
                adopted = state.consumer.adopt(parsed.topic, parsed.queue_id, parsed.offset, parsed.lease)
            except InvalidReceiptHandleError as exc:
                if message is None:  # else an earlier handle of this door's: the consumer decides
                    raise InvalidReceiptHandleError(str(exc), status="INVALID_RECEIPT_HANDLE") from None
            else:
                with state.lock:
                    state.held[key] = message = adopted
        if message.receipt_handle != parsed.lease:
            message = _with_handle(message, parsed.lease)
        return state, message

    def ack(self, group: str, client_id: str, handle: str) -> None:
        state, message = self.held(group, client_id, handle)
        state.consumer.ack(message)
        with state.lock:
            state.held.pop((message.topic, message.queue_id, message.queue_offset), None)

    def dead_letter(self, group: str, client_id: str, handle: str) -> None:
        """Give a received message up to the group's dead letters (the retry job moves it)."""
        state, message = self.held(group, client_id, handle)
        state.consumer.dead_letter(message)
        with state.lock:
            state.held.pop((message.topic, message.queue_id, message.queue_offset), None)

    def change_invisible(self, group: str, client_id: str, handle: str, invisible_ms: int) -> str:
        state, message = self.held(group, client_id, handle)
        changed = state.consumer.change_invisible_time(message, invisible_ms)
        with state.lock:
            state.held[(changed.topic, changed.queue_id, changed.queue_offset)] = changed
        return self.handle_of(group, client_id, changed)

    @staticmethod
    def handle_of(group: str, client_id: str, message: ReceivedMessage) -> str:
        return ReceiptHandle(
            group, client_id, message.topic, message.queue_id, message.queue_offset, message.receipt_handle
        ).encode()


def _with_handle(message: ReceivedMessage, lease: str) -> ReceivedMessage:
    out = object.__new__(ReceivedMessage)
    out.__dict__.update(message.__dict__)
    out.__dict__["receipt_handle"] = lease
    return out


__all__ = ["DEFAULT_PORT", "GrpcServer"]
