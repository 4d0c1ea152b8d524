"""The README's examples run, so they never rot.

A ```python block preceded by ``<!-- test -->`` runs as is; one preceded by ``<!-- test: spark -->``
runs after them, with the shared SparkSession. Every block runs in a temporary working directory, so
``./mqdata`` is a fresh store.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
_BLOCK = re.compile(r"<!-- test(?::\s*(?P<kind>\w+))? -->\s*\n```python\n(?P<code>.*?)\n```", re.DOTALL)


def blocks(kind: str | None) -> list[str]:
    return [m.group("code") for m in _BLOCK.finditer(README.read_text()) if m.group("kind") == kind]


def run(code: str, namespace: dict[str, Any]) -> None:
    exec(compile(code, str(README), "exec"), namespace)


def test_readme_has_a_tested_python_example() -> None:
    assert blocks(None), "README.md needs a ```python block marked <!-- test -->"


def test_readme_setup_is_the_two_commands() -> None:
    text = README.read_text()
    setup = text.split("## Set up on a fresh machine", 1)[1].split("\n## ", 1)[0]
    (commands,) = re.findall(r"```bash\n(.*?)```", setup, re.DOTALL)
    lines = [line.split("#", 1)[0].strip() for line in commands.strip().splitlines()]
    assert lines == ["./spark-submit.sh jobs/demo.py", "./test.sh"]


def test_readme_main_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MQ_STORE", raising=False)
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {"__name__": "readme"}
    for code in blocks(None):
        run(code, namespace)
    assert (tmp_path / "mqdata" / "commit_log" / "_delta_log").is_dir()


@pytest.mark.spark
def test_readme_sql_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spark: Any) -> None:
    monkeypatch.delenv("MQ_STORE", raising=False)
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {"__name__": "readme"}
    for code in blocks(None) + blocks("spark"):
        run(code, namespace)
    assert blocks("spark")
