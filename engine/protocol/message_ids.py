"""Message ids: offset message ids (store id + physical offset) and client unique ids."""

from __future__ import annotations

import itertools
import os
import socket
import struct
import time

from engine.errors import InvalidArgumentError


def make_msg_id(store_id: str, physical_offset: int) -> str:
    """Offset message id: 8-byte store id + 8-byte physical offset, upper-case hex (32 chars)."""
    return f"{store_id.upper()}{physical_offset:016X}"


def parse_msg_id(msg_id: str) -> tuple[str, int]:
    """Inverse of :func:`make_msg_id`.

    Raises:
        InvalidArgumentError: not 32 hex characters.
    """
    if not isinstance(msg_id, str) or len(msg_id) != 32:
        raise InvalidArgumentError(f"msg_id {msg_id!r} is not 32 hex characters", msg_id=msg_id)
    try:
        return msg_id[:16].upper(), int(msg_id[16:], 16)
    except ValueError as exc:
        raise InvalidArgumentError(f"msg_id {msg_id!r} is not hex", msg_id=msg_id) from exc


class UniqKeyGenerator:
    """Client unique ids as RocketMQ's ``MessageClientIDSetter``: ip, pid, random, time, counter."""

    def __init__(self) -> None:
        try:
            ip = socket.inet_aton(socket.gethostbyname(socket.gethostname()))
        except OSError:
            ip = b"\x7f\x00\x00\x01"
        self._prefix = (ip + struct.pack(">H", os.getpid() & 0xFFFF) + os.urandom(4)).hex().upper()
        self._start = time.time()
        self._counter = itertools.count(1)  # next() on a count is atomic under the GIL

    def next(self) -> str:
        counter = next(self._counter) & 0xFFFF
        elapsed = int((time.time() - self._start) * 1000) & 0xFFFFFFFF
        return f"{self._prefix}{elapsed:08X}{counter:04X}"

    def next_many(self, n: int) -> list[str]:
        """``n`` ids at once (a batch send): one clock reading, consecutive counters."""
        head = f"{self._prefix}{int((time.time() - self._start) * 1000) & 0xFFFFFFFF:08X}"
        counter = self._counter
        return [f"{head}{next(counter) & 0xFFFF:04X}" for _ in range(n)]
