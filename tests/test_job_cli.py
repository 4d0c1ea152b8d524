"""The command line every job shares (engine/spark/jobs/runner.py job_main): bad input is one line and exit 2,
before Spark starts."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from engine.spark.jobs.registry import JOB_ORDER

JOBS = [*JOB_ORDER, "broker"]


def _main(job: str) -> object:
    return importlib.import_module(f"jobs.{job}").main


@pytest.mark.parametrize("job", JOBS)
def test_an_unknown_option_is_one_line_and_exit_2(job: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert _main(job)(["--no-such-option"]) == 2  # type: ignore[operator]
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"jobs/{job}.py: error: unrecognized arguments: --no-such-option"]


@pytest.mark.parametrize("job", JOBS)
def test_a_store_that_is_a_file_is_one_line_and_exit_2(
    job: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "f"
    path.write_text("x")
    assert _main(job)(["--store", str(path), "--once"]) == 2  # type: ignore[operator]
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"jobs/{job}.py: error: --store {path} is a file; a store is a directory or an object-store URI"
    ]


@pytest.mark.parametrize(
    ("job", "args", "message"),
    [
        ("index", ["--trigger-ms", "0"], "--trigger-ms must be > 0, got 0"),
        ("retry", ["--trigger-ms", "-5"], "--trigger-ms must be > 0, got -5"),
        ("retry", ["--max-reconsume-times", "-1"], "--max-reconsume-times must be >= 0, got -1"),
        ("schedule", ["--trigger-ms", "0"], "--trigger-ms must be > 0, got 0"),
        ("maintenance", ["--interval", "0"], "--interval must be > 0, got 0"),
        ("broker", ["--jobs", "dispatch,nope"], "unknown jobs ['nope']"),
    ],
)
def test_a_bad_job_option_is_one_line_and_exit_2_and_touches_no_store(
    job: str, args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "never-created"
    assert _main(job)(["--store", str(root), "--once", *args]) == 2  # type: ignore[operator]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"jobs/{job}.py: error: {message}")
    assert not root.exists()
