"""The README's first command: jobs/demo.py runs every broker job once and a short tour."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from engine import Admin, Producer, PullConsumer, Store
from engine.store import schemas
from jobs.demo import DELAY_S, GROUP, QUEUES, TOPIC, produce, run_demo

ROOT = Path(__file__).resolve().parent.parent


def _console() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=200, force_terminal=False), out


def test_the_delayed_message_is_awaited_from_when_its_send_returned(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    Admin(store).create_topic(TOPIC, QUEUES)
    real_send = Producer.send
    returned: list[float] = []

    def slow_send(self: Producer, message: Any, *args: Any, **kwargs: Any) -> Any:
        result = real_send(self, message, *args, **kwargs)
        if kwargs.get("delay_level"):
            time.sleep(0.5)  # a busy machine: the delayed message's commit returns late
            returned.append(time.monotonic())
        return result

    monkeypatch.setattr(Producer, "send", slow_send)
    due = produce(store, _console()[0])
    [sent] = returned
    assert due >= sent + DELAY_S  # its store time is before the send returned: it is surely due by then


@pytest.mark.spark
def test_demo_pulls_tag_a_and_the_delayed_message_after_one_broker_pass_and_a_rerun_pulls_only_new_ones(
    spark: Any, tmp_path: Path
) -> None:
    store = Store.open(tmp_path / "mqdata")
    console, out = _console()

    found = run_demo(spark, store, console)

    text = out.getvalue()
    # 5 TagA singles + the batch of 5 + the delayed message, re-put by the schedule job and dispatched.
    assert found == 11
    assert "delayed by level 1 (1s)" in text.split("pulled by", 1)[1]
    for job in ("dispatch", "index", "schedule", "retry", "pull_log", "transaction_check", "maintenance"):
        assert job in text
    consumer = PullConsumer(store, GROUP)
    committed = sum(consumer.committed_offset(TOPIC, q) or 0 for q in range(QUEUES))
    assert committed == 16  # every message of the topic, TagB ones skipped by the filter included
    assert store.version(schemas.CONSUME_QUEUE) >= 1

    # A second run on the same store pulls only what the group has not consumed: the new 11.
    assert run_demo(spark, store, _console()[0]) == 11
    assert sum(consumer.committed_offset(TOPIC, q) or 0 for q in range(QUEUES)) == 32


@pytest.mark.slow
@pytest.mark.spark
def test_readme_first_command_runs_the_demo_end_to_end(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "COLUMNS": "200",
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    }
    done = subprocess.run(
        [str(ROOT / "spark-submit.sh"), "jobs/demo.py", "--store", str(tmp_path / "mqdata")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "11 new TagA message(s)" in done.stdout
    assert "SQL: messages per queue" in done.stdout


def test_demo_with_a_store_that_is_a_file_is_one_line_and_exit_2(tmp_path: Path, capsys: Any) -> None:
    from jobs.demo import main

    blocker = tmp_path / "file"
    blocker.write_text("not a store")

    assert main(["--store", str(blocker)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("jobs/demo.py: error:") and err.count("\n") == 1
