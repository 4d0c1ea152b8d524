"""``mq serve`` in a process of its own, as a user starts it, for the tests of its doors."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

STOP_WAIT_S = 60


@contextlib.contextmanager
def mq_serve(
    root: Path, *options: str, errors: Path
) -> Iterator[tuple[subprocess.Popen[str], dict[str, Any]]]:
    """``mq serve --json`` over the store at ``root`` with ``options``; the process and its ready line.

    Its stderr goes to the file ``errors``, not to a pipe nobody reads (a full pipe blocks the
    server, and its broker process, in a write). Stopped after with SIGTERM (unless it has ended),
    it must exit 0 within a minute: one that does not is killed and the test fails with its stderr.
    """
    cmd = [sys.executable, "-m", "engine.cli", "--store", str(root), "--json", "serve", *options]
    with errors.open("w") as err:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=err, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}
        )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            pytest.fail(f"mq serve printed no ready line; its stderr: {errors.read_text()[-3000:]}")
        yield proc, json.loads(line)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
            said = errors.read_text()[-3000:]
            pytest.fail(f"mq serve did not stop within {STOP_WAIT_S} s of SIGTERM; its stderr: {said}")
    assert code == 0, errors.read_text()[-3000:]
