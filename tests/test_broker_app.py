"""The broker app (jobs/broker.py): every job of the registry in one Spark application, progress,
``mq status``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from engine import Admin, Message, Producer, PullConsumer, PullStatus, SendResult, Store
from engine.cli import main as mq
from engine.errors import InvalidArgumentError
from engine.spark.jobs.broker_app import selected_jobs
from engine.spark.jobs.registry import JOBS, job_named
from engine.spark.progress import ProgressMonitor, status_from_progress
from engine.store import schemas
from engine.store.consume_queue import dispatched_version
from engine.store.status import FINISHED, STOPPED, JobStatus, read_statuses, store_status, write_status
from jobs.broker import JOB_ORDER, main, run_forever

ROOT = Path(__file__).resolve().parent.parent


def _pull_one(store: Store, topic: str, sent: SendResult) -> PullStatus:
    result = PullConsumer(store, "g").pull(topic, sent.queue_id, sent.queue_offset, max_nums=1)
    return result.status


def _bodies(store: Store, topic: str, queues: int = 4) -> list[bytes]:
    consumer, out = PullConsumer(store, "g"), []
    for q in range(queues):
        result = consumer.pull(topic, q, 0, max_nums=64)
        out += [m.body for m in result.messages]
    return sorted(out)


def test_the_broker_runs_the_registrys_jobs_in_order_and_rejects_unknown_names() -> None:
    assert tuple(job.name for job in JOBS) == JOB_ORDER
    assert JOB_ORDER == (
        "dispatch",
        "index",
        "schedule",
        "retry",
        "pull_log",
        "transaction_check",
        "maintenance",
    )
    assert list(selected_jobs()) == list(JOB_ORDER)
    assert list(selected_jobs(["index", "dispatch", "retry"], skip=["retry"])) == ["dispatch", "index"]
    assert job_named("dispatch").source_table == schemas.COMMIT_LOG
    assert job_named("pull_log").source_table == schemas.ACTION_LOG
    with pytest.raises(InvalidArgumentError, match="unknown jobs"):
        selected_jobs([*JOB_ORDER, "no_such_job"])
    with pytest.raises(InvalidArgumentError, match="unknown job 'no_such_job'"):
        job_named("no_such_job")


def test_unknown_job_names_are_bad_input(store: Store, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--store", store.root, "--once", "--jobs", "dispatch,nope"]) == 2
    assert "unknown jobs ['nope']" in capsys.readouterr().err


def test_status_of_a_progress_has_rates_and_end_to_end_delay(store: Store, topic: str) -> None:
    with Producer(store) as p:
        sent = p.send(Message(topic, b"x"))
    version = store.version(schemas.COMMIT_LOG)
    stored = Admin(store).view_message(sent.offset_msg_id).store_ts_ms
    started = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(stored / 1000 + 2)) + ".000Z"
    progress = {
        "batchId": 4,
        "numInputRows": 1,
        "inputRowsPerSecond": 2.0,
        "processedRowsPerSecond": 8.5,
        "batchDuration": 250,
        "timestamp": started,
        "name": "q",
        "sources": [{"endOffset": json.dumps({"version": version})}],
    }
    status = status_from_progress("dispatch", progress, store=store, source_table=schemas.COMMIT_LOG)
    assert (status.batch_id, status.num_input_rows, status.batch_duration_ms) == (4, 1, 250)
    assert status.processed_rows_per_second == 8.5
    assert status.end_to_end_delay_ms is not None
    assert 1000 <= status.end_to_end_delay_ms <= 3250  # 2 s later (to the second) + the batch
    assert "end-to-end delay" in status.line()
    idle = status_from_progress("dispatch", {**progress, "numInputRows": 0}, store=store, source_table="x")
    assert idle.end_to_end_delay_ms is None


class _FakeQuery:
    """What ProgressMonitor reads from a StreamingQuery."""

    name = "fake"

    def __init__(self) -> None:
        self.recentProgress: list[dict[str, Any]] = []

    @property
    def lastProgress(self) -> dict[str, Any] | None:
        return self.recentProgress[-1] if self.recentProgress else None

    def batch(self, rows: int) -> None:
        self.recentProgress.append(
            {"batchId": len(self.recentProgress), "numInputRows": rows, "batchDuration": 5, "timestamp": None}
        )


def test_progress_monitor_logs_batches_with_rows_counts_missed_ones_and_writes_status(store: Store) -> None:
    lines: list[str] = []
    monitor = ProgressMonitor(store, heartbeat_s=3600, log=lines.append)
    query = _FakeQuery()
    monitor.watch("dispatch", query)
    assert read_statuses(store)[0].state == "running"
    query.batch(0)
    monitor.poll()  # the first idle batch is a heartbeat
    query.batch(0)
    monitor.poll()  # later idle batches are not logged
    assert len(lines) == 1
    query.batch(3)
    query.batch(4)  # two batches between polls
    [written] = monitor.poll()
    assert (written.batch_id, written.num_input_rows, written.total_input_rows, written.batches) == (
        3,
        4,
        7,
        4,
    )
    assert len(lines) == 2 and "batch 3: 4 rows" in lines[-1]
    assert monitor.poll() == []  # nothing new
    final = monitor.finish("dispatch", STOPPED)
    assert final.state == STOPPED and final.total_input_rows == 7
    assert {s.job: s.state for s in read_statuses(store)} == {"dispatch": STOPPED}


class _Clock:
    """A monotonic clock that reads what the test sets: a machine booted ``now`` seconds ago."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_progress_monitor_heartbeat_does_not_depend_on_the_machines_uptime(store: Store) -> None:
    clock = _Clock(5.0)  # booted 5 s ago: time.monotonic() is far below the heartbeat
    lines: list[str] = []
    monitor = ProgressMonitor(store, heartbeat_s=30, log=lines.append, clock=clock)
    query = _FakeQuery()
    monitor.watch("schedule", query)
    query.batch(0)
    [written] = monitor.poll()  # the first idle batch is logged and written whatever the clock says
    assert written.batch_id == 0 and len(lines) == 1
    clock.now = 6.0
    query.batch(0)
    assert monitor.poll() == [] and len(lines) == 1  # 1 s later: neither a line nor a status
    clock.now = 11.0
    query.batch(0)
    assert [s.batch_id for s in monitor.poll()] == [2] and len(lines) == 1  # status every 5 s
    clock.now = 35.0
    query.batch(0)
    monitor.poll()
    assert len(lines) == 2 and "batch 3: 0 rows" in lines[-1]  # a heartbeat 30 s after the first


def test_mq_status_without_jobs_shows_table_sizes(store: Store, topic: str, capsys: Any) -> None:
    with Producer(store) as p:
        p.send_batch([Message(topic, b"a"), Message(topic, b"b")])
    assert mq(["--store", store.root, "status"]) == 0
    out = capsys.readouterr().out
    assert "no job has reported progress yet" in out
    sizes = {t.table: t for t in store_status(store).tables}
    assert (sizes["commit_log"].rows, sizes["commit_log"].files) == (2, 1)
    assert sizes["commit_log"].version == store.version(schemas.COMMIT_LOG)
    assert set(sizes) == set(schemas.SCHEMAS)
    write_status(store, JobStatus("dispatch", STOPPED, 0, batch_id=3, detail="by hand"))
    assert mq(["--store", store.root, "status"]) == 0
    out = capsys.readouterr().out
    assert "dispatch" in out and "stopped" in out and "commit_log" in out


@pytest.mark.spark
def test_broker_once_runs_every_job_so_sends_are_pullable_indexed_and_delays_delivered(
    spark: Any, store: Store, topic: str, capsys: Any
) -> None:
    with Producer(store) as p:
        plain = p.send(Message(topic, b"plain", keys=("order-1",)))
        p.send(Message(topic, b"delayed"), delay_level=1)  # due in 1 s
    time.sleep(1.1)
    assert main(["--store", store.root, "--once"]) == 0
    out = capsys.readouterr().out
    assert "broker: ran dispatch, index" in out

    assert _pull_one(store, topic, plain) is PullStatus.FOUND
    [by_key] = Admin(store).query_by_key(topic, "order-1", 0, 2**62)
    assert by_key.offset_msg_id == plain.offset_msg_id
    assert _bodies(store, topic) == [b"delayed", b"plain"]  # delivered, then dispatched by round two

    statuses = {s.job: s for s in read_statuses(store)}
    assert statuses["dispatch"].state == FINISHED
    assert statuses["dispatch"].total_input_rows >= 2
    assert statuses["index"].end_to_end_delay_ms is not None
    assert set(JOB_ORDER) <= set(statuses)
    assert statuses["broker"].detail is not None and "dispatch" in statuses["broker"].detail
    for job, s in statuses.items():
        assert s.state == FINISHED, (job, s)

    assert mq(["--store", store.root, "status"]) == 0
    shown = capsys.readouterr().out
    assert "dispatch" in shown and "finished" in shown and "consume_queue" in shown


@pytest.mark.spark
def test_running_broker_serves_sends_until_stopped(spark: Any, store: Store, topic: str) -> None:
    stop = threading.Event()
    running: dict[str, Any] = {}
    ready = threading.Event()
    lines: list[str] = []
    result: dict[str, Any] = {}

    def started(queries: dict[str, Any]) -> None:
        running.update(queries)
        ready.set()

    def serve() -> None:
        result["run"] = run_forever(
            spark,
            store,
            stop,
            skip=["maintenance"],
            monitor_interval_s=0.2,
            log=lines.append,
            started=started,
            grace_s=5,
        )

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        assert ready.wait(120), "the broker's queries did not start"
        with Producer(store) as p:
            sent = p.send(Message(topic, b"live", keys=("live-key",)))
        deadline = time.monotonic() + 60
        assert _pull_one(store, topic, sent) is PullStatus.FOUND  # pullable at once (the queue's tail)
        while dispatched_version(store) < store.version(schemas.COMMIT_LOG):
            assert time.monotonic() < deadline, "the running dispatch query never dispatched the send"
            time.sleep(0.2)
        while Admin(store).query_by_uniq_key(topic, sent.uniq_key) is None:
            assert time.monotonic() < deadline, "the running index query never indexed the send"
            time.sleep(0.2)
    finally:
        stop.set()
        thread.join(120)
    assert not thread.is_alive()
    run = result["run"]
    assert run.ok, run.failed
    assert {"dispatch", "index"} <= set(run.ran) and "maintenance" not in run.ran
    assert all(not q.isActive for q in running.values())
    statuses = {s.job: s for s in read_statuses(store)}
    assert statuses["dispatch"].state == STOPPED and statuses["broker"].state == STOPPED
    assert any(line.startswith("dispatch:") and "rows" in line for line in lines)


@pytest.mark.spark
@pytest.mark.slow
def test_broker_process_stops_cleanly_on_sigterm(store: Store, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    errors = tmp_path / "broker.err"
    with errors.open("w") as err:  # a file: nobody reads a pipe while the broker starts (Spark logs)
        proc = subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "jobs" / "broker.py"),
                "--store",
                store.root,
                "--jobs",
                "dispatch,index",
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    try:
        deadline = time.monotonic() + 120
        while True:
            statuses = {s.job: s for s in read_statuses(store)}
            if "broker" in statuses and statuses["broker"].state == "running":
                break
            assert proc.poll() is None, errors.read_text()[-2000:]
            assert time.monotonic() < deadline, "the broker never reported running"
            time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, errors.read_text()[-2000:]
    assert "broker: ran dispatch, index" in out
    assert {s.job: s.state for s in read_statuses(store)}["dispatch"] == STOPPED
