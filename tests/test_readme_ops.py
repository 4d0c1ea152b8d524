"""The README's `mq` sessions run as written: each ```bash block marked ``<!-- test: mq -->`` (or
``mq-spark``) runs under ``bash -euo pipefail`` in an empty directory, with this environment's
``mq`` first on the PATH."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
_BLOCK = re.compile(r"<!-- test: (?P<kind>mq(?:-spark)?) -->\s*\n```bash\n(?P<code>.*?)\n```", re.DOTALL)


def block(kind: str) -> str:
    [code] = [m.group("code") for m in _BLOCK.finditer(README.read_text()) if m.group("kind") == kind]
    return code


def run(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MQ_") and k != "COLUMNS"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", code],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_readme_operations_session_runs(tmp_path: Path) -> None:
    done = run(block("mq"), tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "TopicShrinkError" not in done.stderr
    assert "DISPATCHED" in done.stdout  # the trace
    assert "refused: a group is still behind" in done.stdout
    assert "mq: error: topic 'Orders' is still consumed by group(s) billing" in done.stderr
    assert (tmp_path / "mqdata" / "commit_log").is_dir()


@pytest.mark.spark
@pytest.mark.slow
def test_readme_spark_session_runs(tmp_path: Path) -> None:
    done = run(block("mq-spark"), tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "1 message(s) of Orders with key order-42" in done.stdout
    assert re.search(r"Orders\s*│\s*1", done.stdout), done.stdout
