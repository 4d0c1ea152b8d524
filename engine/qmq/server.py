"""QMQ's door: the meta-server locator (HTTP), the meta server and a broker, on a thread of their own.

* ``GET /meta/address`` on the HTTP port answers the meta server's ``host:port`` (what QMQ clients
  are configured with: ``setMetaServer("http://host:port/meta/address")``).
* The meta server answers CLIENT_REGISTER (producers, consumers, delay producers; online requests
  and heartbeats) with the one broker group that serves every subject, and keeps each consumer's
  online state and last heartbeat.
* The broker answers SEND_MESSAGE (into the subject's topic, a result per message), PULL_MESSAGE
  (long poll, numbered in the consumer's pull-log sequence space: :mod:`engine.qmq.pull_sequences`)
  and ACK_REQUEST (pull sequences mapped back to queue offsets).

A frame that breaks the protocol closes its connection; an unknown request code is answered
UNKNOWN_CODE; a request the store refuses gets an error answer. Nothing a client sends stops the
server or writes a table on bad input.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from engine.client.admin import Admin
from engine.client.producer import DOOR_REGROUP_MS, Producer
from engine.client.sending import PreparedSend
from engine.errors import InvalidArgumentError, MQError, RemotingProtocolError, TopicNotFoundError
from engine.model import MessageExt
from engine.protocol.message_ids import UniqKeyGenerator
from engine.protocol.names import is_system_topic, is_valid_topic_name
from engine.protocol.qmq import (
    QMQ_GROUP_ATTRIBUTE,
    QMQ_RETRY_DELAY_MS,
    qmq_delayed_retry_subject,
    qmq_retry_due_ms,
    qmq_retry_subject,
    qmq_store_group,
    qmq_store_subject,
    qmq_tags_match,
)
from engine.protocol.rebalance import MessageQueue
from engine.protocol.schedule import schedule_envelope
from engine.protocol.topics import system_topic_config
from engine.qmq import codec
from engine.qmq.codec import Code, Frame, ProducerCode
from engine.qmq.messages import from_store, message_tags, to_store
from engine.qmq.pull_sequences import LEASE_MS, QmqConsumer
from engine.remoting.framing import LoopThread, read_frames
from engine.remoting.landing import Landings
from engine.store.commit_log import PendingMessage
from engine.store.consume_queue import QueueIndex
from engine.store.store import Store, now_ms

_log = logging.getLogger(__name__)
T = TypeVar("T")
BROKER_GROUP = "lakemq-qmq"
POLL_INTERVAL_S = 0.05
OFFLINE_AFTER_MS = 180_000  # QMQ: a consumer silent 3 minutes is offline (its unacked go to retry)
FORGOTTEN_AFTER_MS = 2 * 24 * 3600 * 1000  # ... and forever offline (forgotten) after 2 days
SWEEP_INTERVAL_S = 10.0
MAX_PULL_WAIT_MS = 30_000


@dataclass
class ClientState:
    """What the meta server knows of one registered client of a subject."""

    client_type: int
    subject: str
    group: str
    client_id: str
    online: bool
    last_heartbeat_ms: int


def pull_log_consumer_id(subject: str, consumer_id: str) -> str:
    """The action-log consumer id of a QMQ consumer's pulls of ``subject``: QMQ numbers pulls per
    (subject, group, consumer), the pull log per (group, consumer)."""
    return f"{consumer_id}@{subject}"


def tag_filter(filters: Sequence[codec.TagFilter]) -> Callable[[MessageExt], bool] | None:
    """What a pull's tag filters keep (all of them must pass), None without filters."""
    if not filters:
        return None

    def keep(message: MessageExt) -> bool:
        tags = message_tags(message)
        return all(qmq_tags_match(f.kind, f.tags, tags) for f in filters)

    return keep


class QmqServer:
    """QMQ's meta-server locator, meta server and broker over a store.

    Args:
        store: the store served.
        host: the address the three servers bind (127.0.0.1 unless told otherwise).
        http_port, meta_port, broker_port: ports (0: any free port; see the attributes after start).
        advertised_host: the host clients are told (default ``host``).
        auto_create_topics: a send to a missing subject creates its topic (default: the store's
            config ``auto_create_topics``).
        max_frame_bytes: frames longer than this close the connection.
        idle_timeout_s: a connection silent this long is closed.
        retry_delay_ms: a nack (a send to a retry subject) reaches its consumers this long after it
            was sent, through the schedule topic (QMQ's broker: 5 s); 0: at once.
        lease_ms: a message handed out and not acked is handed on after this long (QMQ: 180 s).

    Raises:
        InvalidArgumentError: a port outside 0..65535.
    """

    def __init__(
        self,
        store: Store,
        *,
        host: str = "127.0.0.1",
        http_port: int = 8080,
        meta_port: int = 20880,
        broker_port: int = 20881,
        advertised_host: str | None = None,
        auto_create_topics: bool | None = None,
        max_frame_bytes: int = codec.DEFAULT_MAX_FRAME_BYTES,
        idle_timeout_s: float = 120.0,
        frame_timeout_s: float = 30.0,
        retry_delay_ms: int = QMQ_RETRY_DELAY_MS,
        lease_ms: int = LEASE_MS,
    ) -> None:
        for name, port in (("http_port", http_port), ("meta_port", meta_port), ("broker_port", broker_port)):
            if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
                raise InvalidArgumentError(f"{name} {port!r} must be an int in 0..65535", **{name: port})
        self.store = store
        self.host = host
        self.advertised_host = advertised_host or host
        self.http_port, self.meta_port, self.broker_port = http_port, meta_port, broker_port
        self.auto_create_topics = (
            store.config.auto_create_topics if auto_create_topics is None else auto_create_topics
        )
        self.max_frame_bytes = max_frame_bytes
        self.idle_timeout_s = idle_timeout_s
        self.frame_timeout_s = frame_timeout_s
        self.retry_delay_ms = retry_delay_ms
        self.lease_ms = lease_ms
        self.clients: dict[tuple[int, str, str, str], ClientState] = {}
        self.producer = Producer(store, "QMQ_WIRE", linger_ms=0, regroup_ms=DOOR_REGROUP_MS)
        self._landings = Landings()  # a SEND_MESSAGE's sends share commits: one wake-up for them
        self._ids = UniqKeyGenerator()
        self.index = QueueIndex(store)
        self._consumers: dict[tuple[str, str, str], QmqConsumer] = {}
        self._group_since: dict[tuple[str, str], int] = {}  # when the door first saw a group on a subject
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(8, thread_name_prefix="mq-qmq")
        self._pull_executor = ThreadPoolExecutor(64, thread_name_prefix="mq-qmq-pull")
        self._serving = LoopThread("mq-qmq", self._main)
        self._sent: asyncio.Event | None = None
        self._conn_tasks: set[asyncio.Task[Any]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self.meta_handlers: dict[int, Callable[[Frame], Awaitable[Frame | None]]] = {
            Code.CLIENT_REGISTER: self._client_register,
            Code.HEARTBEAT: self._heartbeat,
        }
        self.broker_handlers: dict[int, Callable[[Frame], Awaitable[Frame | None]]] = {
            Code.SEND_MESSAGE: self._send,
            Code.PULL_MESSAGE: self._pull,
            Code.ACK_REQUEST: self._ack,
            Code.HEARTBEAT: self._heartbeat,
        }

    # ----------------------------------------------------------------- lifecycle
    def start(self) -> QmqServer:
        """Bind the three ports and serve on a background thread; returns once bound.

        Raises:
            OSError: a port could not be bound.
        """
        try:
            self._serving.start()
        except BaseException:
            self._close_engine()
            raise
        return self

    def stop(self, timeout: float = 30) -> None:
        """Close every connection and the servers, then flush what the consumers buffered."""
        self._serving.stop(timeout)
        self._close_engine()

    def _close_engine(self) -> None:
        for consumer in list(self._consumers.values()):
            with contextlib.suppress(Exception):  # closing must not fail the shutdown
                consumer.close()
        self.producer.close()
        self._executor.shutdown(wait=True, cancel_futures=True)
        self._pull_executor.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> QmqServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def meta_address(self) -> str:
        return f"{self.advertised_host}:{self.meta_port}"

    @property
    def broker_address(self) -> str:
        return f"{self.advertised_host}:{self.broker_port}"

    @property
    def meta_server_url(self) -> str:
        """The URL QMQ clients are configured with (``setMetaServer``)."""
        return f"http://{self.advertised_host}:{self.http_port}/meta/address"

    def consumer(self, subject: str, group: str, consumer_id: str) -> QmqConsumer:
        """The door's state of one QMQ consumer of ``subject`` (made on first use).

        A group new to a subject starts at the latest message, as QMQ's broker starts it
        (``ConsumeQueueManager.getOrCreate``): it gets what is stored from the door's first sight
        of the group on the subject (its first registration or pull) on, in the queues it never
        leased from. A retry subject is read from its first message."""
        key = (subject, group, consumer_id)
        with self._lock:
            found = self._consumers.get(key)
            if found is None:
                since = (
                    None
                    if is_system_topic(subject)
                    else self._group_since.setdefault((subject, group), now_ms())
                )
                found = self._consumers[key] = QmqConsumer(
                    self.store,
                    group,
                    pull_log_consumer_id(subject, consumer_id),
                    self.index,
                    since,
                    lease_ms=self.lease_ms,
                )
            return found

    def subscribe(self, subject: str, group: str, consumer_id: str) -> int:
        """A consumer's registration: the group's start in each queue of ``subject`` it never read
        is fixed now (see :meth:`consumer`); returns the number of queues fixed.

        Raises:
            StoreError: the store failed.
        """
        return self.consumer(subject, group, consumer_id).fix_start(subject)

    async def _call(self, fn: Callable[..., T], *args: object, pull: bool = False) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._pull_executor if pull else self._executor, functools.partial(fn, *args)
        )

    # ----------------------------------------------------------------- serving
    async def _main(self) -> None:
        stopped = self._serving.stopped
        assert stopped is not None
        self._sent = asyncio.Event()
        bound: list[asyncio.Server] = []
        try:
            bound.append(await asyncio.start_server(self._serve_http, self.host, self.http_port))
            bound.append(
                await asyncio.start_server(
                    lambda r, w: self._serve(r, w, self.meta_handlers), self.host, self.meta_port
                )
            )
            bound.append(
                await asyncio.start_server(
                    lambda r, w: self._serve(r, w, self.broker_handlers), self.host, self.broker_port
                )
            )
        except BaseException:
            for server in bound:
                server.close()
            raise
        http, meta, broker = bound
        self.http_port = http.sockets[0].getsockname()[1]
        self.meta_port = meta.sockets[0].getsockname()[1]
        self.broker_port = broker.sockets[0].getsockname()[1]
        sweeper = asyncio.create_task(self._sweep_loop())
        self._serving.ready()
        async with http, meta, broker:
            await stopped.wait()
            sweeper.cancel()
            for server in (http, meta, broker):
                server.close()
            for writer in list(self._writers):
                writer.close()
            if self._conn_tasks:
                await asyncio.wait(list(self._conn_tasks), timeout=10)

    async def _serve_http(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """The meta-server locator: ``GET /meta/address`` -> ``host:port`` of the meta server."""
        try:
            line = await asyncio.wait_for(reader.readline(), self.frame_timeout_s)
            while True:  # the request's headers, up to the blank line
                header = await asyncio.wait_for(reader.readline(), self.frame_timeout_s)
                if header in (b"\r\n", b"\n", b""):
                    break
            parts = line.decode("latin-1").split()
            if len(parts) >= 2 and parts[0] == "GET" and parts[1].split("?")[0] == "/meta/address":
                status, body = "200 OK", self.meta_address.encode()
            else:
                status, body = "404 Not Found", b"not found"
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
                f"Connection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _serve(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        handlers: Mapping[int, Callable[[Frame], Awaitable[Frame | None]]],
    ) -> None:
        me = asyncio.current_task()
        if me is not None:
            self._conn_tasks.add(me)
            me.add_done_callback(self._conn_tasks.discard)
        self._writers.add(writer)
        peer = str(writer.get_extra_info("peername"))
        lock = asyncio.Lock()
        tasks: set[asyncio.Task[Any]] = set()
        frames = read_frames(
            reader,
            functools.partial(codec.check_length, max_frame_bytes=self.max_frame_bytes),
            codec.decode_frame,
            idle_timeout_s=self.idle_timeout_s,
            frame_timeout_s=self.frame_timeout_s,
            peer=peer,
        )
        try:
            async for frame in frames:
                if frame.is_response:
                    continue
                task = asyncio.create_task(self._handle(frame, handlers, writer, lock))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        finally:
            self._writers.discard(writer)
            for task in tasks:
                task.cancel()
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _handle(
        self,
        frame: Frame,
        handlers: Mapping[int, Callable[[Frame], Awaitable[Frame | None]]],
        writer: asyncio.StreamWriter,
        lock: asyncio.Lock,
    ) -> None:
        handler = handlers.get(frame.code)
        response: Frame | None
        if handler is None:
            response = frame.response(Code.UNKNOWN_CODE)
        else:
            try:
                response = await handler(frame)
            except asyncio.CancelledError:
                raise
            except RemotingProtocolError as exc:
                _log.info("bad QMQ request %s: %s", frame.code, exc)
                response = frame.response(Code.PARAM_ERROR)
            except MQError as exc:
                _log.warning("QMQ request %s failed: %s", frame.code, exc)
                response = frame.response(Code.BROKER_ERROR)
            except Exception as exc:
                _log.exception("QMQ request %s failed", frame.code, exc_info=exc)
                response = frame.response(Code.BROKER_ERROR)
        if response is None or frame.is_oneway:
            return
        try:
            async with lock:
                writer.write(codec.encode_frame(response))
                await writer.drain()
        except (ConnectionError, OSError, RuntimeError) as exc:
            _log.debug("QMQ response lost: %s", exc)

    # ----------------------------------------------------------------- meta server
    async def _client_register(self, frame: Frame) -> Frame:
        attrs = codec.read_string_map(frame.body)
        subject = attrs.get("subject", "")
        group = qmq_store_group(attrs.get("consumerGroup", ""))
        client_id = attrs.get("clientId", "")
        try:
            client_type = int(attrs.get("clientTypeCode", codec.ClientType.OTHER))
        except ValueError:
            client_type = codec.ClientType.OTHER
        now = now_ms()
        subscribing = (
            client_type == codec.ClientType.CONSUMER
            and bool(group and client_id)
            and is_valid_topic_name(subject)
            and not is_system_topic(subject)
        )
        if subscribing:  # the group's start (before the client can learn it is registered)
            with self._lock:
                self._group_since.setdefault((subject, group), now)
        key = (client_type, subject, group, client_id)
        state = self.clients.get(key)
        if state is None:
            state = self.clients[key] = ClientState(client_type, subject, group, client_id, True, now)
        state.last_heartbeat_ms = now
        state.online = True
        if subscribing:
            await self._call(self.subscribe, subject, group, client_id)
        body = codec.encode_meta_response(
            now,
            subject,
            group,
            codec.ONLINE if state.online else codec.OFFLINE,
            client_type,
            [codec.BrokerGroup(BROKER_GROUP, self.broker_address, now)],
        )
        return frame.response(Code.SUCCESS, body)

    async def _heartbeat(self, frame: Frame) -> Frame:
        return frame.response(Code.SUCCESS)

    def sweep(self, now: int | None = None) -> list[ClientState]:
        """Take consumers silent for :data:`OFFLINE_AFTER_MS` offline, handing what they were given
        and did not ack to their group's retry subject (acking it where it was), and forget those
        silent for :data:`FORGOTTEN_AFTER_MS`; returns the consumers taken offline now. Runs every
        :data:`SWEEP_INTERVAL_S` on the server's loop; a consumer that registers again is online.

        Raises:
            StoreError: the store failed (what was not handed over stays for the next sweep).
        """
        now = now_ms() if now is None else now
        gone: list[ClientState] = []
        for key, state in list(self.clients.items()):
            silent = now - state.last_heartbeat_ms
            if silent > FORGOTTEN_AFTER_MS:
                self.clients.pop(key, None)
                with self._lock:
                    forgotten = self._consumers.pop((state.subject, state.group, state.client_id), None)
                if forgotten is not None:
                    if state.online:
                        self._to_retry(forgotten, state.subject, state.group)
                    forgotten.close()
                continue
            if (
                state.client_type != codec.ClientType.CONSUMER
                or not state.online
                or silent <= OFFLINE_AFTER_MS
            ):
                continue
            with self._lock:
                consumer = self._consumers.get((state.subject, state.group, state.client_id))
            if consumer is not None:
                self._to_retry(consumer, state.subject, state.group)
            state.online = False
            gone.append(state)
        self.hand_on(now)
        return gone

    def hand_on(self, now: int | None = None) -> list[tuple[str, str, str]]:
        """Hand on what consumers hold unacked once they have neither pulled nor acked for
        ``lease_ms``, registered or not: each such message goes to the group's retry subject and is
        acked where it was, as QMQ's broker does for a subscriber silent 3 minutes (its
        ``RetryTask``). A consumer that keeps pulling keeps what it holds (QMQ's broker never takes
        it from an online subscriber; a restarted client gets it again through ``pullOffsetLast``).
        Returns the (subject, group, consumer id) handed on from now. Runs in :meth:`sweep`.

        Raises:
            StoreError: the store failed (what was not handed over stays for the next sweep).
        """
        now = now_ms() if now is None else now
        with self._lock:
            consumers = list(self._consumers.items())
        handed: list[tuple[str, str, str]] = []
        for (subject, group, consumer_id), consumer in consumers:
            if now - consumer.last_active_ms <= self.lease_ms or not consumer.unacked():
                continue
            self._to_retry(consumer, subject, group)
            handed.append((subject, group, consumer_id))
        return handed

    def _to_retry(self, consumer: QmqConsumer, subject: str, group: str) -> None:
        """Copy a consumer's unacked messages to the group's retry subject, then ack them."""
        retry = subject if is_system_topic(subject) else qmq_retry_subject(subject, group)
        for pulled in consumer.unacked():
            message = consumer.message(pulled)
            if message is not None:
                self._store_one(from_store(message, retry))
            consumer.ack(pulled.sequence, pulled.sequence)

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_INTERVAL_S)
            try:
                await self._call(self.sweep)
            except Exception as exc:
                _log.warning("QMQ consumer sweep failed (tried again): %s", exc)

    def consumers_of(self, subject: str, group: str) -> list[ClientState]:
        """The registered consumers of a subject in a group (online or not)."""
        return [
            s
            for s in self.clients.values()
            if s.client_type == codec.ClientType.CONSUMER and s.subject == subject and s.group == group
        ]

    # ----------------------------------------------------------------- broker
    def _ensure_topic(self, topic: str) -> None:
        configs = self.store.topic_configs()
        if configs.get(topic) is not None or self.store.topic_configs(refresh=True).get(topic) is not None:
            return
        if not self.auto_create_topics:
            raise TopicNotFoundError(f"subject {topic!r} has no topic", topic=topic)
        Admin(self.store).create_topic(topic)

    def _prepare(self, message: codec.QmqMessage) -> PreparedSend:
        """Check a QMQ message and choose its queue (as the Producer does), writing nothing but a
        missing topic.

        Raises:
            MQError: a subject the store cannot take (bad name, missing with auto-creation off, ...).
        """
        group = message.attributes().get(QMQ_GROUP_ATTRIBUTE) if message.is_delay else None
        retry = qmq_delayed_retry_subject(message.subject, message.is_delay, qmq_store_group(group or ""))
        if retry is not None and not is_valid_topic_name(retry):
            retry = None  # a group the store cannot name: stored where it was sent
        if retry is None and not is_system_topic(message.subject):
            self._ensure_topic(message.subject)
            return self.producer.prepare(to_store(message))
        # A consumer's send-back to its retry subject (``%RETRY%<subject>%<group>``; a nack, or a
        # delayed retry: see qmq_delayed_retry_subject) or dead subject: a broker-owned topic, which
        # producers may not write; stored as the retry job stores its re-puts. A delayed retry waits
        # in the schedule topic until its time, a nack for ``retry_delay_ms``.
        subject = retry or message.subject
        now = now_ms()
        due = message.expire_ms if retry is not None else qmq_retry_due_ms(subject, now, self.retry_delay_ms)
        plain = to_store(message)
        pending = PendingMessage(
            topic=subject,
            queue_id=0,
            body=plain.body,
            uniq_key=self._ids.next(),
            keys=tuple(plain.keys),
            properties=dict(plain.properties),
            born_ts_ms=message.created_ms,
        )
        destination = None
        if due is not None and due > now:
            envelope = schedule_envelope(subject, 0, pending.properties, sent_ms=now, deliver_at_ms=due)
            pending = pending._replace(**envelope._asdict())
            destination = MessageQueue(subject, 0)
        known = self.store.topic_configs(refresh=True)
        for name in sorted({subject, pending.topic} - set(known)):
            self.store.put_topic(system_topic_config(name, now_ms()))
        return PreparedSend(pending, destination)

    def _store_one(self, message: codec.QmqMessage) -> None:
        self.producer.append(self._prepare(message))

    def _prepare_all(self, messages: list[codec.QmqMessage]) -> list[PreparedSend | str]:
        """Each message prepared, or why it cannot be stored."""
        out: list[PreparedSend | str] = []
        for message in messages:
            try:
                out.append(self._prepare(message))
            except MQError as exc:
                out.append(str(exc)[:1000])
        return out

    async def _send(self, frame: Frame) -> Frame:
        """Store a SEND_MESSAGE's messages: each one queued for the producer's next group commit
        (shared with the sends of other connections), a result per message once it landed."""
        try:
            messages = codec.decode_send_messages(frame.body)
        except RemotingProtocolError as exc:
            _log.info("unreadable SEND_MESSAGE: %s", exc)
            return frame.response(Code.BROKER_ERROR)
        # A send-back to a broadcast consumer's retry subject names its client id: stored under the
        # store's name for it (qmq_store_subject), as its pulls of that subject read it.
        messages = [dataclasses.replace(m, subject=qmq_store_subject(m.subject)) for m in messages]
        storable = [m for m in messages if is_valid_topic_name(m.subject)]
        prepared = dict(zip(map(id, storable), await self._call(self._prepare_all, storable), strict=True))
        pending = {
            id(m): self._landings.wait(self.producer.append_async(p))
            for m in storable
            if isinstance(p := prepared[id(m)], PreparedSend)
        }
        results: list[tuple[str, int, str]] = []
        for message in messages:
            key = id(message)
            if key not in prepared:
                results.append((message.message_id, ProducerCode.SUBJECT_NOT_ASSIGNED, "bad subject"))
                continue
            if key not in pending:
                results.append((message.message_id, ProducerCode.STORE_ERROR, str(prepared[key])))
                continue
            try:
                await pending[key]
            except MQError as exc:
                results.append((message.message_id, ProducerCode.STORE_ERROR, str(exc)[:1000]))
                continue
            results.append((message.message_id, ProducerCode.SUCCESS, ""))
        if self._sent is not None:
            self._sent.set()
            self._sent = asyncio.Event()
        return frame.response(Code.SUCCESS, codec.encode_send_results(results))

    async def _pull(self, frame: Frame) -> Frame:
        request = codec.decode_pull_request(frame.body, frame.version)
        subject = qmq_store_subject(request.subject)
        if not request.consumer_id or not request.group or not is_valid_topic_name(subject):
            return frame.response(Code.NO_MESSAGE)
        # A broadcast consumer's group is its client id: every one gets every message.
        consumer = self.consumer(subject, qmq_store_group(request.group), request.consumer_id)
        consumer.broadcast = request.broadcast
        keep = tag_filter(request.filters)
        wait_ms = min(max(request.timeout_ms, 0), MAX_PULL_WAIT_MS)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_ms / 1000
        while True:
            first, got = await self._call(
                consumer.pull, subject, request.request_num, request.pull_offset_last, keep, pull=True
            )
            if got:
                body = codec.encode_pulled(first, [from_store(m, request.subject) for _, m in got])
                return frame.response(Code.SUCCESS, body)
            left = deadline - loop.time()
            if left <= 0:
                return frame.response(Code.NO_MESSAGE)
            sent = self._sent
            if sent is not None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(sent.wait(), min(left, 0.5))
            else:
                await asyncio.sleep(min(left, POLL_INTERVAL_S))

    async def _ack(self, frame: Frame) -> Frame:
        request = codec.decode_ack_request(frame.body)
        if request.pull_offset_begin < 0 or not request.consumer_id or not request.group:
            return frame.response(Code.SUCCESS)  # the client's empty ack (a keep-alive)
        if request.broadcast == 1:
            return frame.response(Code.SUCCESS)  # acked when handed out (QMQ ignores these acks)
        consumer = self.consumer(
            qmq_store_subject(request.subject), qmq_store_group(request.group), request.consumer_id
        )
        await self._call(consumer.ack, request.pull_offset_begin, request.pull_offset_last)
        return frame.response(Code.SUCCESS)
