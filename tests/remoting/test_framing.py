"""The doors' shared read side: frames are yielded in order until the peer hangs up, breaks the
protocol or falls silent; nothing a peer sends escapes as an exception."""

from __future__ import annotations

import asyncio
import time

import pytest

from engine.errors import RemotingProtocolError
from engine.remoting.framing import LoopThread, read_frames


def check(length: int) -> int:
    if not 1 <= length <= 8:
        raise RemotingProtocolError(f"length {length}", field="length")
    return length


def decode(payload: bytes) -> bytes:
    if payload.startswith(b"!"):
        raise RemotingProtocolError("refused", field="payload")
    if payload.startswith(b"?"):
        raise ValueError("a bug of the decoder")
    return payload


def frames_of(
    data: bytes, *, eof: bool = True, idle_timeout_s: float = 30, frame_timeout_s: float = 30
) -> list[bytes]:
    async def collect() -> list[bytes]:
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        if eof:
            reader.feed_eof()
        found = read_frames(
            reader, check, decode, idle_timeout_s=idle_timeout_s, frame_timeout_s=frame_timeout_s
        )
        return [frame async for frame in found]

    return asyncio.run(collect())


def frame(payload: bytes) -> bytes:
    return len(payload).to_bytes(4, "big") + payload


def test_frames_are_yielded_in_order_until_the_peer_hangs_up() -> None:
    assert frames_of(frame(b"one") + frame(b"two") + b"\x00\x00") == [b"one", b"two"]


@pytest.mark.parametrize(
    "bad",
    [frame(b"!no"), frame(b"?bug"), b"\x00\x00\x00\x09" + b"x" * 9, b"\xff\xff\xff\xff"],
)
def test_a_frame_refused_by_the_door_ends_the_connection_without_raising(bad: bytes) -> None:
    assert frames_of(frame(b"ok") + bad + frame(b"never")) == [b"ok"]


def test_a_silent_peer_is_dropped_after_the_idle_timeout() -> None:
    assert frames_of(frame(b"ok"), eof=False, idle_timeout_s=0.01) == [b"ok"]


def test_a_frame_left_unfinished_is_dropped_after_the_frame_timeout_not_the_idle_one() -> None:
    started = time.monotonic()
    assert frames_of(frame(b"ok") + b"\x00\x00\x00\x05ab", eof=False, frame_timeout_s=0.05) == [b"ok"]
    assert time.monotonic() - started < 10  # the idle timeout (30 s) did not apply


def test_a_peer_that_keeps_sending_outlives_the_idle_timeout() -> None:
    async def collect() -> list[bytes]:
        reader = asyncio.StreamReader()

        async def send() -> None:
            for i in range(6):  # 0.3 s in all, each gap within the idle timeout of 0.2 s
                reader.feed_data(frame(b"%d" % i))
                await asyncio.sleep(0.05)
            reader.feed_eof()

        feeding = asyncio.create_task(send())
        found = [f async for f in read_frames(reader, check, decode, idle_timeout_s=0.2, frame_timeout_s=0.2)]
        await feeding
        return found

    assert asyncio.run(collect()) == [b"%d" % i for i in range(6)]


def test_a_loop_thread_starts_once_ready_and_ends_when_stopped() -> None:
    seen: list[str] = []

    async def main() -> None:
        seen.append("bound")
        serving.ready()
        assert serving.stopped is not None
        await serving.stopped.wait()
        seen.append("stopped")

    serving = LoopThread("test-loop", main)
    serving.start()
    assert seen == ["bound"]
    serving.stop(30)
    assert seen == ["bound", "stopped"]


def test_a_loop_thread_that_fails_before_ready_raises_from_start() -> None:
    async def main() -> None:
        raise OSError("address in use")

    with pytest.raises(OSError, match="address in use"):
        LoopThread("test-loop", main).start()
