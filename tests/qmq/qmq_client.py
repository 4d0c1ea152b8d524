"""A minimal QMQ wire client for the door's tests: frames over a socket, one request at a time."""

from __future__ import annotations

import socket
import struct
import urllib.request

from engine.qmq import codec
from engine.qmq.codec import Frame


class QmqWire:
    """One connection to a QMQ port (meta server or broker)."""

    def __init__(self, address: str) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        self.opaque = 0

    def __enter__(self) -> QmqWire:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read_frame(self) -> Frame:
        head = self._exactly(4)
        (length,) = struct.unpack(">i", head)
        return codec.decode_frame(self._exactly(length))

    def _exactly(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("closed by the server")
            out += chunk
        return out

    def request(self, code: int, body: bytes = b"", version: int = codec.VERSION_9) -> Frame:
        self.opaque += 1
        self.send_raw(codec.encode_frame(Frame(code, self.opaque, 0, version, code, body)))
        response = self.read_frame()
        assert response.is_response and response.opaque == self.opaque
        return response

    def closed(self) -> bool:
        """True when the server closed the connection (reads end)."""
        try:
            return self.sock.recv(1) == b""
        except ConnectionError:
            return True


def locate(url: str) -> str:
    """What the meta-server locator answers (``MetaServerLocator``)."""
    with urllib.request.urlopen(url, timeout=10) as answer:
        return str(answer.read().decode().strip())


def register(address: str, client_type: int, subject: str, group: str = "", client_id: str = "c1") -> Frame:
    attrs = {
        "subject": subject,
        "clientTypeCode": str(client_type),
        "consumerGroup": group,
        "clientId": client_id,
        "requestType": str(codec.RequestType.ONLINE),
        "appCode": "test",
    }
    with QmqWire(address) as wire:
        return wire.request(codec.Code.CLIENT_REGISTER, codec.write_string_map(attrs))
