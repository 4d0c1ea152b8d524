"""Message ids: offset message ids (store id + physical offset) and client unique ids."""

from __future__ import annotations

import datetime
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


def _month_start_ms(epoch_ms: int) -> int:
    """Start of the UTC calendar month holding ``epoch_ms``."""
    day = datetime.datetime.fromtimestamp(epoch_ms / 1000, tz=datetime.UTC)
    start = day.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    return int(start.timestamp() * 1000)


def _next_month_start_ms(month_start_ms: int) -> int:
    day = datetime.datetime.fromtimestamp(month_start_ms / 1000, tz=datetime.UTC)
    nxt = day.replace(year=day.year + 1, month=1) if day.month == 12 else day.replace(month=day.month + 1)
    return int(nxt.timestamp() * 1000)


def uniq_key_time_ms(uniq_key: str, now_ms: int | None = None) -> int:
    """When a client unique id was made (epoch ms), as RocketMQ's ``getNearlyTimeFromID``.

    The id holds milliseconds since the start of the month it was made in; the month is the
    current one unless that would put the time in the future, then the previous one (so an id is
    decoded correctly for up to a month). Months are UTC months here (RocketMQ uses the JVM's
    zone), so an id decodes the same on every host.

    Args:
        uniq_key: a client unique id (32 hex characters, as :attr:`SendResult.msg_id`; 56 when a
            Java client made it on an IPv6 host: 16 bytes of address instead of 4).
        now_ms: the time to decode relative to (default: now).

    Raises:
        InvalidArgumentError: not 32 or 56 hex characters.
    """
    if not isinstance(uniq_key, str) or len(uniq_key) not in (32, 56):
        raise InvalidArgumentError(f"uniq key {uniq_key!r} is not 32 or 56 hex characters", uniq_key=uniq_key)
    try:
        span = int(uniq_key[-12:-4], 16)
    except ValueError as exc:
        raise InvalidArgumentError(f"uniq key {uniq_key!r} is not hex", uniq_key=uniq_key) from exc
    now = int(time.time() * 1000) if now_ms is None else now_ms
    month = _month_start_ms(now)
    if month + span > now:  # Java tests >=, which misplaces an id made this very millisecond
        month = _month_start_ms(month - 1)
    return month + span


class UniqKeyGenerator:
    """Client unique ids laid out as RocketMQ's ``MessageClientIDSetter``: 4 bytes of ip, 2 of pid,
    4 random (Java: the class loader's hash), 4 of milliseconds since the start of the current
    (UTC) month, 2 of a counter; 32 upper-case hex characters."""

    def __init__(self) -> None:
        try:
            ip = socket.inet_aton(socket.gethostbyname(socket.gethostname()))
        except OSError:
            ip = b"\x7f\x00\x00\x01"
        self._prefix = (ip + struct.pack(">H", os.getpid() & 0xFFFF) + os.urandom(4)).hex().upper()
        self._month = (0, -1)  # [start, next start) of the month the time field counts from
        self._counter = itertools.count(1)  # next() on a count is atomic under the GIL

    def _head(self) -> str:
        now = int(time.time() * 1000)
        start, end = self._month
        if not start <= now < end:
            start = _month_start_ms(now)
            self._month = (start, _next_month_start_ms(start))
        return f"{self._prefix}{(now - start) & 0xFFFFFFFF:08X}"

    def next(self) -> str:
        """A new unique id."""
        return f"{self._head()}{next(self._counter) & 0xFFFF:04X}"

    def next_many(self, n: int) -> list[str]:
        """``n`` ids at once (a batch send): one clock reading, consecutive counters."""
        head = self._head()
        counter = self._counter
        return [f"{head}{next(counter) & 0xFFFF:04X}" for _ in range(n)]
