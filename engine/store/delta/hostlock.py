"""An advisory inter-process lock on a local file, so that writers on one host take turns.

The commit-log writers of one host queue on it (:class:`engine.store.commit_log.CommitLogWriter`)
instead of racing: correctness never depends on it (the optimistic protocol on the Delta log is the
guarantee), only fairness and wasted rewrites do.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading

LOCK_ENV = "MQ_SEQUENCER_LOCK"
LOCK_DIR = "_locks"


def host_lock_enabled() -> bool:
    """Whether writers take the inter-process lock (``MQ_SEQUENCER_LOCK``, default on; ``0`` off)."""
    return os.environ.get(LOCK_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


# Longest a writer queues for the host lock before it appends without it (optimistically, so still
# correctly): a holder that is stopped (SIGSTOP, a debugger) or stuck in I/O cannot stall the host.
LOCK_WAIT_S = 10.0


class _LockWaiter(threading.Thread):
    """Blocks in ``flock`` on its own descriptor so that the caller can stop waiting."""

    def __init__(self, fd: int) -> None:
        super().__init__(name="mq-lock-wait", daemon=True)
        self.fd = fd
        self.state = "waiting"  # -> "acquired" | "failed" | "abandoned" (by the caller)
        self.mutex = threading.Lock()
        self.done = threading.Event()

    def run(self) -> None:
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
            outcome = "acquired"
        except OSError:
            outcome = "failed"
        with self.mutex:
            if self.state == "abandoned":
                _unlock(self.fd)  # a lock nobody waits for any more
                return
            self.state = outcome
        self.done.set()


class HostLock:
    """An advisory inter-process lock on a local file (``flock``); not re-entrant.

    Blocking ``flock`` lets the kernel queue the waiters: they are woken when the holder lets go,
    so writers take turns instead of polling. A process that dies holding it releases it at once;
    one that stops holding it makes the others wait at most ``wait_s`` once and go on without it:
    until the holder lets go, their later turns do not wait (nor leave one more thread waiting).
    """

    def __init__(self, path: str, wait_s: float = LOCK_WAIT_S) -> None:
        self.path = path
        self.wait_s = wait_s
        self.usable = True  # False once the lock file cannot be created or opened
        self._fd: int | None = None  # the descriptor holding the lock, while held
        # The descriptor of the last turn, kept open (unlocked) for the next: opening the file for
        # every turn cost a commit-log append more than the lock itself. A process forked since
        # opens its own (flock belongs to the open file, which a fork shares).
        self._spare: int | None = None
        self._spare_pid = 0
        # The last waiter given up on, while it still waits in flock: until it gets the lock (its
        # holder let go), later turns do not wait at all.
        self._abandoned: _LockWaiter | None = None

    def _open(self) -> int | None:
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            return os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError:
            self.usable = False
            return None

    def acquire(self) -> bool:
        """Take the lock, queueing at most ``wait_s``; False means go on without it."""
        fd, self._spare = self._spare, None
        if fd is not None and self._spare_pid != os.getpid():
            fd = None  # the parent's, inherited by a fork: left to the parent
        if fd is None:
            fd = self._open()
            if fd is None:
                return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if self._abandoned is not None and self._abandoned.is_alive():
                # the holder kept the last waiter waiting out wait_s and still has not let go: go on
                # without the lock at once rather than wait again (and start one more waiter)
                self._spare, self._spare_pid = fd, os.getpid()
                return False
            self._abandoned = None
            return self._wait(fd)
        except OSError:
            os.close(fd)
            self.usable = False
            return False
        self._fd = fd
        return True

    def _wait(self, fd: int) -> bool:
        waiter = _LockWaiter(fd)
        waiter.start()
        waiter.done.wait(self.wait_s)
        with waiter.mutex:
            if waiter.state == "waiting":
                waiter.state = "abandoned"  # the waiter closes fd once it gets the lock
                self._abandoned = waiter
                return False
        if waiter.state == "acquired":
            self._fd = fd
            return True
        os.close(fd)
        return False

    def release(self) -> None:
        """Let the lock go; the descriptor is kept for the next turn."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            # Unlocked first: a child forked meanwhile shares the open file (see _unlock).
            fcntl.flock(fd, fcntl.LOCK_UN)
            if self._spare is None:
                self._spare, self._spare_pid = fd, os.getpid()
            else:  # pragma: no cover - one turn at a time
                os.close(fd)

    def close(self) -> None:
        """Let the lock go and close the kept descriptor (also when the lock is dropped)."""
        self.release()
        if self._spare is not None:
            fd, self._spare = self._spare, None
            os.close(fd)

    def __del__(self) -> None:
        with contextlib.suppress(OSError, AttributeError):
            self.close()


def _unlock(fd: int) -> None:
    # Unlock before closing: a child forked meanwhile shares the open file and would keep it locked.
    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
