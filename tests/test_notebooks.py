"""The notebooks under notebooks/ run top to bottom against a fresh store, so they never rot.

Each runs in a new ``python3`` kernel of this interpreter (jupyter_client starts a kernel spec whose
command is ``python`` with ``sys.executable``), in a temporary working directory; each notebook
starts and stops its own SparkSession.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
CELL_TIMEOUT_S = 300


def _kernel_name() -> str:
    """The python3 kernel spec; installed into this environment if it is missing."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        KernelSpecManager().get_kernel_spec("python3")
    except NoSuchKernel:
        import subprocess

        subprocess.run([sys.executable, "-m", "ipykernel", "install", "--sys-prefix"], check=True)
    return "python3"


def run_notebook(name: str, workdir: Path) -> Any:
    book = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    client = NotebookClient(
        book,
        timeout=CELL_TIMEOUT_S,
        kernel_name=_kernel_name(),
        resources={"metadata": {"path": str(workdir)}},
    )
    client.execute()
    return book


def _text(book: Any) -> str:
    out = []
    for cell in book.cells:
        for output in cell.get("outputs", []):
            out.append(output.get("text", ""))
            out.append(output.get("data", {}).get("text/plain", ""))
    return "\n".join(out)


def test_every_notebook_is_a_valid_v4_notebook_with_the_python3_kernel() -> None:
    names = sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb"))
    assert names == ["quickstart", "replay_consumer", "sql_over_queues"]
    for name in names:
        book = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
        nbformat.validate(book)
        assert book.nbformat == 4 and book.metadata.kernelspec.name == "python3"
        assert not any(cell.get("outputs") for cell in book.cells), f"{name} is committed with outputs"


@pytest.mark.spark
@pytest.mark.slow
def test_quickstart_notebook_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MQ_STORE", raising=False)
    text = _text(run_notebook("quickstart", tmp_path))
    assert "dispatched 4 messages" in text
    assert "FOUND" in text
    assert "b'order 2'" in text and "[b'order 1']" in text and "b'order 3'" in text


@pytest.mark.spark
@pytest.mark.slow
def test_sql_over_queues_notebook_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MQ_STORE", raising=False)
    text = _text(run_notebook("sql_over_queues", tmp_path))
    assert "mobile" in text and "web" in text
    assert "|        25|" in text  # the late message shows up in the next query


@pytest.mark.spark
@pytest.mark.slow
def test_replay_consumer_notebook_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MQ_STORE", raising=False)
    text = _text(run_notebook("replay_consumer", tmp_path))
    consumed = [f"'payment {i}'" for i in range(10)]
    line = next(x for x in text.splitlines() if x.startswith("consumed by billing:"))
    assert all(p in line for p in consumed) and "'payment 10'" not in line
    since = next(x for x in text.splitlines() if x.startswith("stored since the bug:"))
    assert "'payment 6'" in since and "'payment 5'" not in since and "'payment 11'" in since
    old = next(x for x in text.splitlines() if x.startswith("as of the old version:"))
    assert "'payment 5'" in old and "'payment 6'" not in old
    assert "commit log: 6 rows at version" in text
