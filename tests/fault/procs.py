"""Starting, killing and collecting the fault scenarios' child processes (the parent's side)."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

REPO_ROOT = Path(__file__).resolve().parents[2]

# Every child started by this process, so a failed scenario leaves none running (see reap()).
_STARTED: list[Child] = []


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra or {})
    env["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    return env


@dataclass
class Child:
    """A started child process in its own session (so a kill reaches a JVM it started, too)."""

    name: str
    popen: subprocess.Popen[str]
    log_path: Path
    started: float

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self) -> None:
        """SIGKILL the child and every process it started (its process group), then reap it."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait(timeout=30)

    def terminate(self, timeout: float = 60) -> None:
        """SIGTERM the child (a clean stop), SIGKILL its group if it does not end in ``timeout``."""
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()

    def stderr(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:] if self.log_path.exists() else ""

    def finish(self, timeout: float = 120) -> dict[str, Any]:
        """Wait for a normal end; returns the JSON counters the worker printed last.

        Raises:
            AssertionError: the child failed, was killed or did not end in ``timeout``.
        """
        try:
            out, _ = self.popen.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"{self.name} did not finish in {timeout}s:\n{self.stderr()}") from None
        assert self.popen.returncode == 0, f"{self.name} exited {self.popen.returncode}:\n{self.stderr()}"
        lines = [line for line in (out or "").splitlines() if line.startswith("{")]
        return dict(json.loads(lines[-1])) if lines else {}

    def stop(self, timeout: float = 60) -> dict[str, Any]:
        """SIGTERM a long-running worker and collect its counters like :meth:`finish`."""
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
        return self.finish(timeout)

    def wait_killed(self, timeout: float = 120) -> int:
        """Wait for a child that is expected to kill itself; returns its return code."""
        try:
            self.popen.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"{self.name} did not end in {timeout}s:\n{self.stderr()}") from None
        return int(self.popen.returncode)


def spawn(name: str, argv: list[str], log_dir: Path, env: Mapping[str, str] | None = None) -> Child:
    """Start ``python <argv>`` (e.g. ``["-m", "tests.fault.workers", "producer", ...]``) from the repo root.

    stdout is captured (workers print one JSON line); stderr goes to ``<log_dir>/<name>.err``;
    ``env`` adds to this process's environment.
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.err"
    err: IO[str] = open(log_path, "w")  # noqa: SIM115 - handed to the child
    try:
        popen = subprocess.Popen(
            [sys.executable, *argv],
            cwd=REPO_ROOT,
            env=child_env(env),
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            start_new_session=True,
        )
    finally:
        err.close()
    child = Child(name, popen, log_path, time.monotonic())
    _STARTED.append(child)
    return child


def reap() -> list[str]:
    """SIGKILL every child started here that is still running (with what it started); returns their
    names. Only these processes are touched: each one's own process group."""
    left = [child for child in _STARTED if child.alive()]
    for child in left:
        child.kill()
    _STARTED.clear()
    return [child.name for child in left]


def worker(
    name: str, role: str, log_dir: Path, env: Mapping[str, str] | None = None, **options: object
) -> Child:
    """Start a ``tests.fault.workers`` role: ``foo_bar=1`` is ``--foo-bar 1``, ``flag=True`` ``--flag``."""
    argv = ["-m", "tests.fault.workers", role]
    for key, value in options.items():
        flag = f"--{key.replace('_', '-')}"
        if value is True:
            argv.append(flag)
        elif value is not False:
            argv += [flag, str(value)]
    return spawn(name, argv, log_dir, env)


def wait_until(condition: Callable[[], bool], timeout: float, what: str, poll: float = 0.05) -> float:
    """Poll ``condition`` until true; returns the seconds it took.

    Raises:
        AssertionError: still false after ``timeout`` seconds.
    """
    began = time.monotonic()
    while not condition():
        if time.monotonic() - began > timeout:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(poll)
    return time.monotonic() - began


def event_lines(path: Path, kind: str = "acknowledged") -> int:
    """How many ``kind`` events a history file holds so far (a cheap progress probe)."""
    if not path.exists():
        return 0
    return path.read_bytes().count(b'"e": "' + kind.encode() + b'"')


def kill_once_sending(
    children: Sequence[Child], history_dir: Path, rng: random.Random, timeout: float
) -> int:
    """Wait until every child has acknowledged a send (its ``<name>.jsonl`` history), then SIGKILL
    them one by one in a random order at random moments (0-0.4 s apart); returns the kills."""
    for child in children:
        log = history_dir / f"{child.name}.jsonl"
        wait_until(lambda log=log: event_lines(log) > 0, timeout, f"{child.name} to be sending")
    for child in sorted(children, key=lambda _: rng.random()):
        time.sleep(rng.uniform(0.0, 0.4))
        assert child.alive(), f"{child.name} ended before it was killed:\n{child.stderr()}"
        child.kill()
        assert child.popen.returncode == -9
    return len(children)
