"""A connection's responses (engine.remoting.context.Connection): whole frames, in order, those sent in
one turn of the loop in one write; a closed connection refuses a frame."""

from __future__ import annotations

import asyncio

import pytest

from engine.remoting.context import Connection
from engine.remoting.frames import RemotingCommand, decode_frame

Pair = tuple[Connection, asyncio.StreamReader, asyncio.StreamWriter, asyncio.AbstractServer]


async def _pair() -> Pair:
    """A connection of the server's side, and the client's reader and writer (keep the writer: once
    collected it closes the connection)."""
    accepted: asyncio.Future[asyncio.StreamWriter] = asyncio.get_running_loop().create_future()

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.set_result(writer)

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client_reader, client_writer = await asyncio.open_connection("127.0.0.1", port)
    writer = await asyncio.wait_for(accepted, 30)
    return Connection("peer", writer), client_reader, client_writer, server


async def _frames(reader: asyncio.StreamReader, n: int) -> list[RemotingCommand]:
    out = []
    for _ in range(n):
        length = int.from_bytes(await asyncio.wait_for(reader.readexactly(4), 30), "big")
        out.append(decode_frame(await asyncio.wait_for(reader.readexactly(length), 30)))
    return out


def test_frames_sent_in_one_turn_go_out_whole_in_order_in_one_write() -> None:
    async def run() -> None:
        conn, reader, client, server = await _pair()
        writes: list[int] = []
        real = conn.writer.write

        def counted(data: bytes) -> None:
            writes.append(len(data))
            real(data)

        conn.writer.write = counted  # type: ignore[method-assign]
        commands = [
            RemotingCommand(code=0, opaque=i, ext_fields={"n": str(i)}, body=b"x" * i) for i in range(5)
        ]
        await asyncio.gather(*(conn.send(c) for c in commands))
        got = await _frames(reader, 5)
        assert [(c.opaque, c.ext_fields, c.body) for c in got] == [
            (c.opaque, c.ext_fields, c.body) for c in commands
        ]
        assert len(writes) == 1
        await conn.send(RemotingCommand(code=0, opaque=9))  # a later turn: a write of its own
        assert [c.opaque for c in await _frames(reader, 1)] == [9] and len(writes) == 2
        conn.writer.close()
        client.close()
        server.close()

    asyncio.run(run())


def test_a_frame_queued_before_the_connection_closes_is_flushed_and_a_closed_one_refuses() -> None:
    async def run() -> None:
        conn, reader, client, server = await _pair()
        sending = asyncio.ensure_future(conn.send(RemotingCommand(code=0, opaque=1)))
        await asyncio.sleep(0)  # queued, not yet written
        conn.flush()
        conn.writer.close()
        await sending
        assert [c.opaque for c in await _frames(reader, 1)] == [1]
        with pytest.raises(ConnectionResetError):
            await conn.send(RemotingCommand(code=0, opaque=2))
        client.close()
        server.close()

    asyncio.run(run())
