"""Data files a process wrote, known to the readers on the same host without reading them back.

Under synchronous sends the commit log gains hundreds of versions a second, each one small file
(the few messages of one group commit), and the broker's passes (dispatch, index) read every one:
a parquet decode of 300 to 700 us apiece, the largest part of the broker process's CPU, which
the serving process then misses (on two cores any busy process slows the request path's hand-offs
between threads). The writer holds those rows already. So a writer of a local table remembers what
it wrote in the process's cache of whole local files (:data:`~engine.store.delta.log.LOCAL_FILES`,
known by path and identity, as a reader finds them) when the process reads local files at all (a
producer that only writes keeps nothing), and sends it through every open feed (one Arrow
IPC datagram a file) to the process at the other end (``mq serve``'s broker process), which puts it
in its own cache.

Best effort and never in the writer's way: a datagram the socket does not take at once (the reader
is behind, the file is too big) is dropped, and the reader decodes that file from disk as before.
The cache's key is the file's identity after it was written, so a file that changed since (a table
removed and made again under the same path) is not mistaken for what was fed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import struct
import threading

import pyarrow as pa

from engine.store.delta.log import LOCAL_FILE_MISS_HOOKS, LOCAL_FILES, local_file_key, local_files_read

_log = logging.getLogger(__name__)

# (path length, inode, size, modification time in ns), then the path, then the rows (Arrow IPC).
_HEADER = struct.Struct("<HqqQ")
# The largest datagram a feed sends and receives; a bigger file is left to be read from disk (the
# files worth feeding are the small ones: a big file's decode is a small part of its cost).
MAX_FEED_BYTES = 1 << 20
_IPC_OPTIONS = pa.ipc.IpcWriteOptions(use_threads=False)


class FileFeed:
    """The sending end of a feed: a local datagram socket whose peer takes the files this process
    writes (:func:`feed_pair` makes both ends, a :class:`FileIntake` reads the other).

    Attributes:
        sent: files sent.
        dropped: files the socket did not take at once (or too big to send).
    """

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.sent = 0
        self.dropped = 0

    def send(self, key: tuple[str, int, int, int], rows: pa.Table) -> None:
        """Send the rows of the file ``key`` names; never waits, never raises."""
        self._put(_datagram(key, rows))

    def _put(self, datagram: list[bytes | pa.Buffer] | None) -> None:
        """Send one file's datagram (None: one that cannot be sent, counted as dropped)."""
        if datagram is None:
            self.dropped += 1
            return
        try:
            self._sock.sendmsg(datagram, [], socket.MSG_DONTWAIT)
            self.sent += 1
        except OSError:
            self.dropped += 1  # full, closed, or the peer is gone: the reader decodes the file

    def close(self) -> None:
        """Stop feeding: no more files are sent (the peer takes what it was sent already)."""
        stop_feeding(self)
        with contextlib.suppress(OSError):
            self._sock.close()


def _datagram(key: tuple[str, int, int, int], rows: pa.Table) -> list[bytes | pa.Buffer] | None:
    """The datagram that carries the rows of the file ``key`` names, or None when it would be over
    :data:`MAX_FEED_BYTES` or cannot be made."""
    try:
        path = key[0].encode()
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, rows.schema, options=_IPC_OPTIONS) as writer:
            writer.write_table(rows)
        body = sink.getvalue()
    except (pa.ArrowException, UnicodeError):
        return None
    if _HEADER.size + len(path) + body.size > MAX_FEED_BYTES:
        return None
    return [_HEADER.pack(len(path), key[1], key[2], key[3]), path, body]


_feeds: list[FileFeed] = []
_feeds_lock = threading.Lock()


def feed_pair() -> tuple[FileFeed, socket.socket]:
    """A new feed: the sending end, already taking this process's files, and the receiving socket
    for the process that reads them (:class:`FileIntake`; a spawned child can be given it)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    for sock, option in ((ours, socket.SO_SNDBUF), (theirs, socket.SO_RCVBUF)):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, option, 4 * MAX_FEED_BYTES)
    feed = FileFeed(ours)
    with _feeds_lock:
        _feeds.append(feed)
    return feed, theirs


def stop_feeding(feed: FileFeed) -> None:
    """Send ``feed`` no more files."""
    with _feeds_lock:
        if feed in _feeds:
            _feeds.remove(feed)


def wrote_local_file(path: str, rows: pa.Table) -> None:
    """``rows`` were written whole as the local file ``path`` and will not change: keep them for
    this process's readers, if it has any, and send them through every open feed. Best effort (a
    file that cannot be looked at is left to be read)."""
    kept = local_files_read()
    with _feeds_lock:
        feeds = list(_feeds)
    if not (kept or feeds):
        return
    try:
        key = local_file_key(path, os.stat(path))
    except OSError:
        return
    if kept:
        LOCAL_FILES.put(key, rows)
    if feeds:
        datagram = _datagram(key, rows)  # made once for every feed
        for feed in feeds:
            feed._put(datagram)


class FileIntake:
    """The receiving end of a feed (the socket :func:`feed_pair` gave for the reader), drained by
    a reader of this process that does not find a local file in the cache, before it reads the
    file: a thread of its own, woken for every file and then waiting for the interpreter lock, cost
    the broker process as much as decoding the files did. A writer feeds a file before its commit
    is there, so a reader that found the commit finds the file in the socket.

    Thread-safe (each datagram is one file, taken whole by one reader).
    """

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self._sock = sock
        self.received = 0  # files put in the cache
        self.malformed = 0
        LOCAL_FILE_MISS_HOOKS.append(self.drain)

    def drain(self) -> int:
        """Put every file sent so far in this process's cache of local files; how many."""
        taken = 0
        while True:
            try:
                data = self._sock.recv(MAX_FEED_BYTES)
            except OSError:  # nothing more now (or the socket is gone): read from disk meanwhile
                return taken
            try:
                length, inode, size, mtime = _HEADER.unpack_from(data)
                start = _HEADER.size + length
                path = data[_HEADER.size : start].decode()
                rows = pa.ipc.open_stream(pa.py_buffer(data)[start:]).read_all()
            except (struct.error, UnicodeError, pa.ArrowException) as exc:
                self.malformed += 1
                _log.warning("file feed: a malformed file was dropped: %s", exc)
                continue
            LOCAL_FILES.put((path, inode, size, mtime), rows)
            self.received += 1
            taken += 1

    def close(self) -> None:
        """Take no more files."""
        with contextlib.suppress(ValueError):
            LOCAL_FILE_MISS_HOOKS.remove(self.drain)
        with contextlib.suppress(OSError):
            self._sock.close()
