"""The remoting endpoint: a name server and a broker over asyncio, on a thread of their own.

Each connection reads frames in order and handles requests concurrently (a client multiplexes its
requests on one connection by ``opaque``). A frame that breaks the protocol (bad length, truncated,
bad header) closes its connection; a request the endpoint cannot serve gets RocketMQ's error
response. Nothing a client sends can stop the server or write a table on a bad request.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Mapping
from typing import Any

from engine.broker.loop import SERVE_DISPATCH_MS, BrokerLoop, BrokerProcess
from engine.errors import (
    CommitConflictError,
    InvalidArgumentError,
    InvalidMessageError,
    InvalidTopicError,
    MessageNotFoundError,
    MQError,
    RemotingProtocolError,
    TopicNotFoundError,
)
from engine.remoting.codes import ResponseCode
from engine.remoting.context import BrokerContext, Connection, Handler
from engine.remoting.frames import DEFAULT_MAX_FRAME_BYTES, RemotingCommand, check_frame_length, decode_frame
from engine.remoting.framing import LoopThread, read_frames
from engine.remoting.handlers import (
    admin,
    admin_clients,
    admin_config,
    admin_groups,
    admin_stats,
    clients,
    namesrv,
    offsets,
    pull,
    queries,
    reply,
    send,
    transactions,
)
from engine.remoting.handlers.transactions import check_back_loop
from engine.store.store import Store
from engine.store.transactions import CheckBack

_log = logging.getLogger(__name__)


BROKER_HANDLERS: dict[int, Handler] = {
    **send.HANDLERS,
    **reply.HANDLERS,
    **pull.HANDLERS,
    **offsets.HANDLERS,
    **clients.HANDLERS,
    **queries.HANDLERS,
    **transactions.HANDLERS,
    **admin.HANDLERS,
    **admin_groups.HANDLERS,
    **admin_config.HANDLERS,
    **admin_stats.HANDLERS,
    # Last: its HEART_BEAT records client details for the connection lists, then calls clients'.
    **admin_clients.HANDLERS,
}
NAMESRV_HANDLERS: dict[int, Handler] = {
    **namesrv.HANDLERS,
    **admin.NAMESRV_HANDLERS,
    **admin_config.NAMESRV_HANDLERS,
}


def error_response(cmd: RemotingCommand, exc: Exception) -> RemotingCommand:
    """RocketMQ's answer to a request that failed with ``exc``."""
    if isinstance(exc, TopicNotFoundError):
        return cmd.response(ResponseCode.TOPIC_NOT_EXIST, str(exc))
    if isinstance(exc, InvalidMessageError | InvalidTopicError):
        return cmd.response(ResponseCode.MESSAGE_ILLEGAL, str(exc))
    if isinstance(exc, MessageNotFoundError):
        return cmd.response(
            ResponseCode.QUERY_NOT_FOUND if cmd.code == 12 else ResponseCode.SYSTEM_ERROR, str(exc)
        )
    if isinstance(exc, CommitConflictError):
        return cmd.response(ResponseCode.SYSTEM_BUSY, str(exc))
    if isinstance(exc, RemotingProtocolError | InvalidArgumentError | MQError):
        return cmd.response(ResponseCode.SYSTEM_ERROR, str(exc))
    _log.exception("request %s failed", cmd.code, exc_info=exc)
    return cmd.response(ResponseCode.SYSTEM_ERROR, f"{type(exc).__name__}: {exc}")


class RemotingServer:
    """A RocketMQ name server and broker endpoint over a store.

    Args:
        store: the store served.
        host: the address both servers bind (127.0.0.1 unless told otherwise).
        namesrv_port, broker_port: ports (0: any free port; see :attr:`namesrv_port` after start).
        advertised_host: the broker address clients are told (default ``host``).
        auto_create_topics: a send to a missing topic creates it (else TOPIC_NOT_EXIST);
            default: the store's config ``auto_create_topics`` (on, as RocketMQ's
            ``autoCreateTopicEnable``).
        run_broker_jobs: run the broker's pass plan (dispatch, index, schedule, retry, pull log,
            transaction check, maintenance) in-process (:class:`~engine.broker.loop.BrokerLoop`);
            off when the Spark jobs run.
        broker_jobs_process: run them in a process of their own
            (:class:`~engine.broker.loop.BrokerProcess`, as ``mq serve`` does) rather than on a
            thread of this one: the passes then take no time from the requests' interpreter lock.
        max_frame_bytes: frames longer than this close the connection.
        idle_timeout_s: a connection silent this long is closed (clients heartbeat every 30 s).
        frame_timeout_s: a frame must arrive whole within this long once its length was read.
        max_in_flight: requests handled at once (all connections); more get SYSTEM_BUSY, as
            RocketMQ's broker answers when its request queue is full.

    Use as a context manager, or :meth:`start` and :meth:`stop`.

    Raises:
        InvalidArgumentError: a port outside 0..65535, a frame limit below 1 KiB, a timeout <= 0,
            an in-flight limit below 1.
    """

    def __init__(
        self,
        store: Store,
        *,
        host: str = "127.0.0.1",
        namesrv_port: int = 9876,
        broker_port: int = 10911,
        advertised_host: str | None = None,
        auto_create_topics: bool | None = None,
        run_broker_jobs: bool = True,
        broker_jobs_process: bool = False,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        idle_timeout_s: float = 120.0,
        frame_timeout_s: float = 30.0,
        max_in_flight: int = 4096,
    ) -> None:
        for name, port in (("namesrv_port", namesrv_port), ("broker_port", broker_port)):
            if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
                raise InvalidArgumentError(f"{name} {port!r} must be an int in 0..65535", **{name: port})
        if (
            isinstance(max_frame_bytes, bool)
            or not isinstance(max_frame_bytes, int)
            or max_frame_bytes < 1024
        ):
            raise InvalidArgumentError(
                f"max_frame_bytes {max_frame_bytes!r} must be an int >= 1024", max_frame_bytes=max_frame_bytes
            )
        if isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int) or max_in_flight < 1:
            raise InvalidArgumentError(
                f"max_in_flight {max_in_flight!r} must be an int >= 1", max_in_flight=max_in_flight
            )
        for name, seconds in (("idle_timeout_s", idle_timeout_s), ("frame_timeout_s", frame_timeout_s)):
            if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds > 0:
                raise InvalidArgumentError(f"{name} {seconds!r} must be a number > 0", **{name: seconds})
        self.store = store
        self.host = host
        self._ports = (namesrv_port, broker_port)
        self.max_frame_bytes = max_frame_bytes
        self.idle_timeout_s = idle_timeout_s
        self.frame_timeout_s = frame_timeout_s
        self.ctx = BrokerContext(
            store,
            advertised_host or host,
            broker_port,
            auto_create_topics=store.config.auto_create_topics
            if auto_create_topics is None
            else auto_create_topics,
        )
        self.checks = CheckBack()
        self.ctx.check_back = self.checks  # type: ignore[attr-defined]
        self.loop_jobs: BrokerLoop | BrokerProcess | None = None
        if run_broker_jobs:
            jobs = BrokerProcess if broker_jobs_process else BrokerLoop
            self.loop_jobs = jobs(store, dispatch_ms=SERVE_DISPATCH_MS)
        self.namesrv_port = namesrv_port
        self.broker_port = broker_port
        self._serving = LoopThread("mq-remoting", self._main)
        self._conn_tasks: set[asyncio.Task[Any]] = set()
        self.max_in_flight = max_in_flight
        self.in_flight = 0

    # ----------------------------------------------------------------- lifecycle
    def start(self) -> RemotingServer:
        """Bind both ports and serve on a background thread; returns once bound.

        Raises:
            OSError: a port could not be bound.
        """
        try:
            self._serving.start()
        except BaseException:
            self.ctx.close()
            raise
        if self.loop_jobs is not None:
            self.loop_jobs.start()
        return self

    def stop(self, timeout: float = 30) -> None:
        """Close every connection and both servers, stop the broker loop and flush."""
        self._serving.stop(timeout)
        if self.loop_jobs is not None:
            self.loop_jobs.stop(timeout)
        self.ctx.close()

    def wait(self) -> None:
        """Block until the server stops."""
        self._serving.join()

    def __enter__(self) -> RemotingServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def namesrv_address(self) -> str:
        """``host:port`` of the name server (what clients set as ``namesrvAddr``)."""
        return f"{self.ctx.host}:{self.namesrv_port}"

    @property
    def broker_address(self) -> str:
        """``host:port`` of the broker endpoint."""
        return self.ctx.address

    # ----------------------------------------------------------------- serving
    async def _main(self) -> None:
        stopped = self._serving.stopped
        assert stopped is not None
        broker = await asyncio.start_server(
            lambda r, w: self._serve(r, w, BROKER_HANDLERS), self.host, self._ports[1]
        )
        try:
            namesrv_server = await asyncio.start_server(
                lambda r, w: self._serve(r, w, NAMESRV_HANDLERS), self.host, self._ports[0]
            )
        except BaseException:
            broker.close()
            raise
        self.broker_port = broker.sockets[0].getsockname()[1]
        self.namesrv_port = namesrv_server.sockets[0].getsockname()[1]
        self.ctx.port = self.broker_port
        checker = asyncio.create_task(check_back_loop(self.ctx, self.checks))
        flusher = asyncio.create_task(self._flush_offsets())
        resetter = asyncio.create_task(self._push_resets())
        watcher = asyncio.create_task(self.ctx.hold.watch())
        self._serving.ready()
        async with broker, namesrv_server:
            await stopped.wait()
            checker.cancel()
            flusher.cancel()
            resetter.cancel()
            watcher.cancel()
            broker.close()
            namesrv_server.close()
            for conn in list(self.ctx.connections):
                conn.writer.close()
            # Closed transports end each connection's read loop; its handlers finish or are cancelled.
            if self._conn_tasks:
                await asyncio.wait(list(self._conn_tasks), timeout=10)
        for task in (checker, flusher, resetter, watcher):
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _flush_offsets(self, interval_s: float = 0.2) -> None:
        """Commit the offsets clients reported, every ``interval_s`` (and once more at stop)."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.ctx.run(self.ctx.offsets.flush)
            except Exception as exc:
                _log.warning("offset flush failed (kept for the next one): %s", exc)

    async def _push_resets(self, interval_s: float = 0.5) -> None:
        """Push resets made in the store (``mq group reset`` from anywhere) to the wire consumers."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                await offsets.push_resets(self.ctx)
            except Exception as exc:
                _log.warning("pushing offset resets failed (tried again): %s", exc)

    async def _serve(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, handlers: Mapping[int, Handler]
    ) -> None:
        peer = str(writer.get_extra_info("peername"))
        me = asyncio.current_task()
        if me is not None:
            self._conn_tasks.add(me)
            me.add_done_callback(self._conn_tasks.discard)
        conn = Connection(peer, writer)
        self.ctx.connections.add(conn)
        tasks: set[asyncio.Task[Any]] = set()
        frames = read_frames(
            reader,
            functools.partial(check_frame_length, max_frame_bytes=self.max_frame_bytes),
            decode_frame,
            idle_timeout_s=self.idle_timeout_s,
            frame_timeout_s=self.frame_timeout_s,
            peer=peer,
        )
        try:
            async for cmd in frames:
                if cmd.is_response:
                    # The answer to a request forwarded to this client; the endpoint's other
                    # requests are one-way.
                    admin_clients.deliver_response(self.ctx, conn, cmd)
                    continue
                task = asyncio.create_task(self._handle(conn, cmd, handlers))
                # A one-way request (sendOneway, the offset commit a client sends as it shuts down)
                # is carried out even when its client hangs up right after it, as RocketMQ's broker
                # does; only requests awaiting a response are cancelled with their connection.
                held = self._conn_tasks if cmd.is_oneway else tasks
                held.add(task)
                task.add_done_callback(held.discard)
        finally:
            self.ctx.connections.discard(conn)
            for task in tasks:
                task.cancel()
            conn.flush()  # the responses of requests done before it closed
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
            await self._forget(conn)

    async def _forget(self, conn: Connection) -> None:
        """A closed connection's consumers leave their groups (RocketMQ's broker does so on close)."""
        for group, client_id in conn.consumer_groups.items():
            if any(c.consumer_groups.get(group) == client_id for c in self.ctx.connections):
                continue
            try:
                await self.ctx.run(clients.leave_sync, self.ctx, group, client_id)
            except Exception as exc:
                _log.warning("leave of %s in %s failed: %s", client_id, group, exc)
            # RocketMQ's doChannelCloseEvent: the others rebalance now, not at their next round.
            await clients.notify_ids_changed(self.ctx, group)

    async def _handle(self, conn: Connection, cmd: RemotingCommand, handlers: Mapping[int, Handler]) -> None:
        handler = handlers.get(cmd.code)
        response: RemotingCommand | None
        if self.in_flight >= self.max_in_flight:
            response = cmd.response(
                ResponseCode.SYSTEM_BUSY, f"[TOO_MANY_REQUESTS] {self.in_flight} requests in flight"
            )
        elif handler is None:
            response = cmd.response(
                ResponseCode.REQUEST_CODE_NOT_SUPPORTED, f" request type {cmd.code} not supported"
            )
        else:
            self.in_flight += 1
            try:
                response = await handler(self.ctx, conn, cmd)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                response = error_response(cmd, exc)
            finally:
                self.in_flight -= 1
        if response is None or cmd.is_oneway:
            return
        try:
            await conn.send(response)
        except (ConnectionError, OSError, RuntimeError) as exc:
            _log.debug("response to %s lost: %s", conn.peer, exc)
