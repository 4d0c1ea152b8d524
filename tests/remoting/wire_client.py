"""A small RocketMQ remoting client for tests: speaks the wire protocol to ``mq serve``'s endpoint.

It writes frames with :func:`engine.remoting.frames.encode_command` and reads them back on a thread,
matching responses to requests by ``opaque``; requests the server sends (CHECK_TRANSACTION_STATE,
NOTIFY_CONSUMER_IDS_CHANGED) are kept in :attr:`WireClient.server_requests`.
"""

from __future__ import annotations

import contextlib
import itertools
import queue
import socket
import struct
import threading
from collections.abc import Mapping

from engine.remoting.codes import RPC_ONEWAY, PullSysFlag, RequestCode
from engine.remoting.frames import RemotingCommand, decode_frame, encode_command
from engine.remoting.message_layout import (
    BatchItem,
    WireMessage,
    decode_stored,
    encode_batch,
    encode_properties,
)


class WireClient:
    """One connection to a name server or broker endpoint."""

    def __init__(self, address: str, timeout: float = 30.0) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.sock.settimeout(None)
        self.timeout = timeout
        self._ids = itertools.count(1)
        self._waiting: dict[int, queue.Queue[RemotingCommand]] = {}
        self._lock = threading.Lock()
        self.server_requests: queue.Queue[RemotingCommand] = queue.Queue()
        self.closed = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _recv(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("closed by the server")
            data += chunk
        return data

    def _read(self) -> None:
        try:
            while True:
                (length,) = struct.unpack(">i", self._recv(4))
                cmd = decode_frame(self._recv(length))
                if cmd.is_response:
                    with self._lock:
                        box = self._waiting.pop(cmd.opaque, None)
                    if box is not None:
                        box.put(cmd)
                else:
                    self.server_requests.put(cmd)
        except (ConnectionError, OSError):
            self.closed.set()

    def request(
        self,
        code: int,
        fields: Mapping[str, object] | None = None,
        body: bytes = b"",
        *,
        oneway: bool = False,
        timeout: float | None = None,
    ) -> RemotingCommand | None:
        """Send a request; its response (None for a one-way request)."""
        opaque = next(self._ids)
        cmd = RemotingCommand(
            code=int(code),
            opaque=opaque,
            flag=RPC_ONEWAY if oneway else 0,
            ext_fields={k: str(v) for k, v in (fields or {}).items()},
            body=body,
        )
        box: queue.Queue[RemotingCommand] = queue.Queue()
        if not oneway:
            with self._lock:
                self._waiting[opaque] = box
        self.sock.sendall(encode_command(cmd))
        if oneway:
            return None
        return box.get(timeout=timeout or self.timeout)

    def call(
        self, code: int, fields: Mapping[str, object] | None = None, body: bytes = b"", **kw: object
    ) -> RemotingCommand:
        """:meth:`request` of a request that has a response."""
        response = self.request(code, fields, body, **kw)  # type: ignore[arg-type]
        assert response is not None
        return response

    # ----------------------------------------------------------------- conveniences
    def send(
        self,
        topic: str,
        body: bytes,
        queue_id: int = 0,
        properties: Mapping[str, str] | None = None,
        *,
        v2: bool = True,
        group: str = "WireProducers",
        sys_flag: int = 0,
        flag: int = 0,
        born_ts_ms: int = 0,
    ) -> RemotingCommand:
        """SEND_MESSAGE_V2 (short field names) or SEND_MESSAGE."""
        fields = {
            "producerGroup": group,
            "topic": topic,
            "defaultTopic": "TBW102",
            "defaultTopicQueueNums": 4,
            "queueId": queue_id,
            "sysFlag": sys_flag,
            "bornTimestamp": born_ts_ms,
            "flag": flag,
            "properties": encode_properties(properties or {}),
            "reconsumeTimes": 0,
            "unitMode": "false",
            "batch": "false",
        }
        if v2:
            names = dict(
                zip(
                    ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "m"], fields.values(), strict=True
                )
            )
            return self.call(RequestCode.SEND_MESSAGE_V2, names, body)
        return self.call(RequestCode.SEND_MESSAGE, fields, body)

    def send_batch(self, topic: str, items: list[BatchItem], queue_id: int = 0) -> RemotingCommand:
        """SEND_BATCH_MESSAGE."""
        fields = {
            "a": "WireProducers",
            "b": topic,
            "c": "TBW102",
            "d": 4,
            "e": queue_id,
            "f": 0,
            "g": 0,
            "h": 0,
            "i": "",
            "j": 0,
            "k": "false",
            "m": "true",
        }
        return self.call(RequestCode.SEND_BATCH_MESSAGE, fields, encode_batch(items))

    def pull(
        self,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        *,
        max_nums: int = 32,
        sys_flag: int = 0,
        suspend_ms: int = 0,
        commit_offset: int = 0,
        subscription: str | None = "*",
        expression_type: str = "TAG",
        timeout: float | None = None,
    ) -> tuple[RemotingCommand, list[WireMessage]]:
        """PULL_MESSAGE; the response and the messages its body holds. The pull carries its
        ``subscription`` (the SUBSCRIPTION sysFlag bit, as a lite-pull consumer sends it); None
        leaves it to the one the group's heartbeat named, as a push consumer does."""
        if subscription is not None:
            sys_flag |= PullSysFlag.SUBSCRIPTION
        fields = {
            "consumerGroup": group,
            "topic": topic,
            "queueId": queue_id,
            "queueOffset": offset,
            "maxMsgNums": max_nums,
            "sysFlag": sys_flag,
            "commitOffset": commit_offset,
            "suspendTimeoutMillis": suspend_ms,
            "subscription": subscription or "",
            "subVersion": 0,
            "expressionType": expression_type,
        }
        response = self.call(RequestCode.PULL_MESSAGE, fields, timeout=timeout)
        return response, decode_stored(response.body) if response.body else []

    @property
    def address(self) -> tuple[str, int]:
        """This client's end of the connection (what the broker sees as the born host)."""
        host, port = self.sock.getsockname()[:2]
        return str(host), int(port)

    def close(self) -> None:
        """Close the connection."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self._reader.join(5)
