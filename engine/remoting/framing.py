"""The read side of a door's connection, shared by the doors (RocketMQ's, QMQ's): length-prefixed
frames read in order, each within its time limits, until the peer hangs up or breaks the protocol.

Both protocols prefix a frame with its length (int32, big endian, excluding itself); what the
length may be and how the rest decodes is the door's own (``check``, ``decode``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import TypeVar

from engine.errors import RemotingProtocolError

F = TypeVar("F")
_log = logging.getLogger(__name__)


async def read_frames(
    reader: asyncio.StreamReader,
    check: Callable[[int], int],
    decode: Callable[[bytes], F],
    *,
    idle_timeout_s: float,
    frame_timeout_s: float,
    peer: str = "",
) -> AsyncIterator[F]:
    """Yield a connection's frames until it closes, stays silent ``idle_timeout_s``, leaves a frame
    unfinished for ``frame_timeout_s``, or sends a frame that ``check`` (its length) or ``decode``
    (its bytes) refuses: the caller then closes the connection. Never raises for what a peer sends.
    """
    while True:
        try:
            head = await asyncio.wait_for(reader.readexactly(4), idle_timeout_s)
            length = check(int.from_bytes(head, "big", signed=True))
            payload = await asyncio.wait_for(reader.readexactly(length), frame_timeout_s)
            frame = decode(payload)
        except (asyncio.IncompleteReadError, TimeoutError, ConnectionError):
            return
        except RemotingProtocolError as exc:
            _log.info("closing %s: %s", peer, exc)
            return
        except Exception as exc:  # an undecodable frame of a kind not foreseen: drop the peer
            _log.warning("closing %s: unreadable frame: %r", peer, exc)
            return
        yield frame
