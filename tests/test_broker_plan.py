"""The broker's pass plan (engine/broker/plan.py): one order of the broker's jobs, followed by the Spark
broker app's ``--once`` and by the in-process loop of ``mq serve``."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from engine import Message, Producer, PullConsumer, PullStatus, Store
from engine.broker.loop import BROKER_NICENESS, SERVE_DISPATCH_MS, BrokerLoop, BrokerProcess
from engine.broker.plan import PLAN, Pass, Step, plan_jobs
from engine.errors import InvalidArgumentError
from engine.protocol.actions import NACK
from engine.remoting import RemotingServer
from engine.spark.jobs import broker_app
from engine.spark.jobs.registry import JOB_ORDER, JOBS, Job, job_named
from engine.store.action_log import ActionLogWriter
from engine.store.schemas import CONSUME_QUEUE
from tests.helpers import eventually

JOBS_OF_PLAN = [step.job for step in PLAN]


def _recording(plan: tuple[Step, ...], ran: list[str], thread_of: dict[str, str]) -> tuple[Step, ...]:
    """``plan`` with every pass replaced by one that records its job, and no input tables (every
    step runs whenever its cadence says)."""

    def make_pass(job: str) -> Pass:
        def run() -> None:
            ran.append(job)
            thread_of[job] = threading.current_thread().name

        return run

    return tuple(replace(s, make_pass=lambda _, job=s.job: make_pass(job), inputs=lambda _: ()) for s in plan)


def test_the_plan_dispatches_and_indexes_again_after_schedule_and_retry_re_put() -> None:
    last_re_put = max(JOBS_OF_PLAN.index("schedule"), JOBS_OF_PLAN.index("retry"))
    assert JOBS_OF_PLAN[0] == "dispatch"  # every other job reads the consume queue
    assert {"dispatch", "index"} <= set(JOBS_OF_PLAN[last_re_put + 1 :])
    assert JOBS_OF_PLAN == [
        "dispatch",
        "index",
        "schedule",
        "retry",
        "dispatch",
        "index",
        "pull_log",
        "transaction_check",
        "maintenance",
    ]


def test_the_job_registry_lists_the_plans_jobs_in_the_order_of_their_first_step() -> None:
    assert JOB_ORDER == plan_jobs() == tuple(dict.fromkeys(JOBS_OF_PLAN))
    assert tuple(job.name for job in JOBS) == JOB_ORDER


def test_the_spark_apps_once_runs_each_step_of_the_plan_in_order(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[str] = []

    def fake(name: str) -> Job:
        def run(spark: Any, store: Store, **keywords: Any) -> None:
            assert keywords["once"] is True
            ran.append(name)

        return replace(job_named(name), run=run)

    monkeypatch.setattr(broker_app, "job_named", fake)
    result = broker_app.run_once(None, store)  # no job really runs: no Spark needed
    assert result.ok
    assert ran == result.ran == list(broker_app.ONCE_PLAN) == JOBS_OF_PLAN


def test_the_loop_runs_the_plans_steps_by_cadence_in_plan_order(store: Store) -> None:
    assert BrokerLoop(store).plan == PLAN
    ran: list[str] = []
    loop = BrokerLoop(store, plan=_recording(PLAN, ran, {}))
    loop.run_once(everything=False)
    assert ran == ["dispatch"]  # a tick
    ran.clear()
    loop.run_once()
    assert ran == [job for job in broker_app.ONCE_PLAN if job != "maintenance"]  # a round
    ran.clear()
    loop.run_slow()
    assert ran == ["maintenance"]
    assert (loop.passes, loop.errors) == (2, 0)


def test_the_loop_runs_maintenance_on_a_thread_of_its_own(store: Store) -> None:
    thread_of: dict[str, str] = {}
    done = {job: threading.Event() for job in ("dispatch", "maintenance")}

    def make_pass(job: str) -> Pass:
        def run() -> None:
            thread_of.setdefault(job, threading.current_thread().name)
            if job in done:
                done[job].set()

        return run

    plan = tuple(replace(s, make_pass=lambda _, job=s.job: make_pass(job)) for s in PLAN)
    loop = BrokerLoop(store, plan=plan, maintenance_ms=1).start()
    try:
        assert all(event.wait(60) for event in done.values())
    finally:
        loop.stop()
    assert thread_of["dispatch"] == "mq-serve-broker-loop"
    assert thread_of["maintenance"] == "mq-serve-broker-maintenance"


def test_a_dead_letter_routed_in_a_round_is_pullable_when_the_round_ends(store: Store, topic: str) -> None:
    loop = BrokerLoop(store)
    with Producer(store) as producer:
        producer.send(Message(topic, b"poison"), queue_id=0)
    loop.run_once(everything=False)
    [message] = PullConsumer(store, "g").pull(topic, 0, 0).messages
    with ActionLogWriter(store, "g", "consumer-1") as writer:  # its 17th failure: a dead letter
        writer.record(NACK, message, reconsume_times=16)
    loop.run_once()
    result = PullConsumer(store, "checker").pull("%DLQ%g", 0, 0)  # nothing dispatched but the loop
    assert result.status == PullStatus.FOUND
    assert [m.uniq_key for m in result.messages] == [message.uniq_key]
    assert loop.errors == 0


def test_the_loop_in_a_process_of_its_own_dispatches_and_stops(store: Store, topic: str) -> None:
    with Producer(store) as producer:
        producer.send(Message(topic, b"a"), queue_id=0)
    loop = BrokerProcess(store, dispatch_ms=10).start()
    try:
        eventually(lambda: store.read(CONSUME_QUEUE).num_rows == 1)
        with Producer(store) as producer:
            producer.send(Message(topic, b"b"), queue_id=0)
        eventually(lambda: store.read(CONSUME_QUEUE).num_rows == 2)
        assert loop.alive
    finally:
        loop.stop()
    assert not loop.alive


@pytest.mark.parametrize("own_process", [True, False])
def test_mq_serve_s_broker_passes_dispatch_at_the_serving_pause(store: Store, own_process: bool) -> None:
    server = RemotingServer(store, namesrv_port=0, broker_port=0, broker_jobs_process=own_process)
    assert isinstance(server.loop_jobs, BrokerProcess if own_process else BrokerLoop)
    assert server.loop_jobs.dispatch_ms == SERVE_DISPATCH_MS > BrokerLoop(store).dispatch_ms


def test_the_loop_process_runs_below_the_servers_cpu_priority(store: Store, topic: str) -> None:
    ours = os.getpriority(os.PRIO_PROCESS, 0)
    for niceness, expected in ((BROKER_NICENESS, min(ours + BROKER_NICENESS, 19)), (0, ours)):
        loop = BrokerProcess(store, dispatch_ms=10, niceness=niceness).start()
        try:
            child = loop.pid
            assert child is not None
            eventually(lambda c=child, e=expected: os.getpriority(os.PRIO_PROCESS, c) == e, timeout_s=60)
        finally:
            loop.stop()
    for bad in (-1, 20, 2.5, True):
        with pytest.raises(InvalidArgumentError, match="niceness"):
            BrokerProcess(store, niceness=bad)  # type: ignore[arg-type]


def test_a_loop_process_that_dies_is_started_again_and_dispatches(
    store: Store, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    loop = BrokerProcess(store, dispatch_ms=10, restart_s=0.1).start()
    try:
        first = loop.pid
        assert first is not None
        with caplog.at_level(logging.WARNING, logger="engine.broker.loop"):
            os.kill(first, signal.SIGKILL)
            eventually(lambda: loop.restarts == 1 and loop.alive, timeout_s=60)
        assert loop.pid != first
        (record,) = [r for r in caplog.records if "exited" in r.getMessage()]
        assert f"process {first} exited with code -9" in record.getMessage()
        with Producer(store) as producer:  # sent after the death: only a new child dispatches it
            producer.send(Message(topic, b"after"), queue_id=0)
        eventually(lambda: store.read(CONSUME_QUEUE).num_rows == 1, timeout_s=60)
    finally:
        loop.stop()
    assert not loop.alive
    assert loop.restarts == 1  # a stop is not a death: nothing started again


def test_a_ctrl_c_in_the_loop_process_first_moments_neither_ends_it_nor_prints_a_traceback(
    store: Store, topic: str, capfd: pytest.CaptureFixture[str]
) -> None:
    loop = BrokerProcess(store, dispatch_ms=10, restart_s=0.1).start()
    try:
        child = loop.pid
        assert child is not None
        for _ in range(20):  # from its start (while it imports) on, as a Ctrl-C reaches the group
            with contextlib.suppress(ProcessLookupError):  # (a child they ended: the asserts say so)
                os.kill(child, signal.SIGINT)
                os.kill(child, signal.SIGTERM)
            time.sleep(0.05)
        with Producer(store) as producer:
            producer.send(Message(topic, b"after the signals"), queue_id=0)
        eventually(lambda: store.read(CONSUME_QUEUE).num_rows == 1, timeout_s=60)
        assert loop.alive and loop.pid == child and loop.restarts == 0
    finally:
        loop.stop()
    assert "KeyboardInterrupt" not in capfd.readouterr().err


ROOT = Path(__file__).resolve().parent.parent
_ORPHAN = """
import sys, time
from engine import Store
from engine.broker.loop import BrokerProcess
loop = BrokerProcess(Store.open(sys.argv[1])).start()
print(loop.pid, flush=True)
time.sleep(600)
"""


_FIRST_SPAWN = """
import sys
from engine import Store
from engine.broker.loop import BrokerProcess
loop = BrokerProcess(Store.open(sys.argv[1])).start()  # this process's first multiprocessing use
with open(f"/proc/{loop.pid}/status") as f:
    print(" ".join(line.strip() for line in f if line.startswith(("SigBlk", "SigIgn"))), flush=True)
loop.stop()
"""


def test_the_loops_process_never_meets_a_ctrl_c_unguarded_even_as_the_first_one_started(
    store: Store,
) -> None:
    # Starting multiprocessing's resource tracker (the first process a process spawns) unblocks
    # SIGINT and SIGTERM: a child spawned right after must still start with them blocked.
    run = [sys.executable, "-c", _FIRST_SPAWN, store.root]
    out = subprocess.run(run, capture_output=True, text=True, cwd=ROOT, timeout=120, check=True).stdout
    masks = dict(re.findall(r"(SigBlk|SigIgn):\s*([0-9a-f]+)", out))
    guarded = int(masks["SigBlk"], 16) | int(masks["SigIgn"], 16)  # blocked at first, then ignored
    for stop in (signal.SIGINT, signal.SIGTERM):
        assert guarded & (1 << (stop - 1)), (stop, masks)


def test_the_loops_process_leaves_when_the_server_that_started_it_dies(store: Store) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", _ORPHAN, store.root], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert _running(child)
        parent.kill()
        parent.wait(30)
        eventually(lambda: not _running(child), timeout_s=30)
    finally:
        parent.kill()
        parent.wait(30)


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie awaiting its reaper counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
