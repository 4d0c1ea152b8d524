"""The broker restarts a failed job's query from its checkpoint, and stops when a job keeps failing."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from engine import Message, Producer, Store
from engine.errors import InvalidArgumentError
from engine.spark.jobs import dispatch as dispatch_job
from engine.spark.jobs.broker_app import BrokerRun
from engine.spark.jobs.runner import first_line
from engine.spark.jobs.supervision import BACKOFF_S, RestartPolicy
from engine.store import schemas
from engine.store.consume_queue import dispatched_version
from jobs.broker import main, run_forever


def test_backoff_grows_with_the_failures_inside_the_window():
    policy = RestartPolicy(max_restarts=3, window_s=100)
    assert [policy.failed("dispatch", t) for t in (0.0, 1.0, 2.0)] == list(BACKOFF_S[:3])
    assert policy.failed("index", 2.0) == BACKOFF_S[0]  # every job counts its own failures
    assert policy.failed("dispatch", 3.0) is None  # a fourth failure within 100 s: give up
    assert policy.restarts("dispatch") == 4 and policy.restarts("schedule") == 0


def test_failures_older_than_the_window_are_forgiven():
    policy = RestartPolicy(max_restarts=1, window_s=10)
    assert policy.failed("dispatch", 0.0) == BACKOFF_S[0]
    assert policy.failed("dispatch", 10.5) == BACKOFF_S[0]  # the first one fell out of the window
    assert policy.failed("dispatch", 11.0) is None


def test_listing_races_are_restarted_at_once_and_counted_apart():
    race = "[DELTA_VERSIONS_NOT_CONTIGUOUS] Versions (4401, 4402, 4404) are not contiguous"
    policy = RestartPolicy(max_restarts=1, window_s=100, max_listing_races=3)
    assert [policy.failed("index", t, race) for t in (0.0, 1.0, 2.0)] == [BACKOFF_S[0]] * 3
    assert policy.restarts("index") == 0 and policy.listing_races("index") == 3
    assert policy.failed("index", 3.0, "Python worker failed to connect back") == BACKOFF_S[0]
    assert policy.failed("index", 4.0, race) is None  # a log that stays gapped still stops the broker
    assert RestartPolicy(max_restarts=0).failed("index", 0.0, race) is None  # no restarts at all


def test_zero_restarts_fails_at_the_first_failure_and_bad_settings_are_refused():
    assert RestartPolicy(max_restarts=0).failed("dispatch", 0.0) is None
    with pytest.raises(InvalidArgumentError, match="max_restarts"):
        RestartPolicy(max_restarts=-1)
    with pytest.raises(InvalidArgumentError, match="window"):
        RestartPolicy(window_s=0)


def test_a_negative_max_restarts_is_bad_input_before_spark_starts(store: Store, capsys: Any):
    assert main(["--store", store.root, "--max-restarts", "-1"]) == 2
    assert "max_restarts" in capsys.readouterr().err


def test_summary_names_restarted_jobs():
    run = BrokerRun(ran=["dispatch"], restarted={"dispatch": 2})
    assert "restarted dispatch 2x" in run.summary(1.0)


def _serve(
    spark: Any, store: Store, policy: RestartPolicy, stop: threading.Event, out: dict[str, Any]
) -> None:
    out["run"] = run_forever(
        spark, store, stop, jobs=["dispatch"], monitor_interval_s=0.2, grace_s=5, restarts=policy
    )


@pytest.mark.spark
def test_a_failed_dispatch_query_is_restarted_and_dispatches_what_it_missed(
    spark: Any, store: Store, topic: str, monkeypatch: pytest.MonkeyPatch
):
    real, calls = dispatch_job.dispatch_committed, []

    def fails_once(s: Store) -> tuple[int, int]:
        calls.append(1)
        if len(calls) == 1:
            raise OSError("injected: the object store timed out")
        return real(s)

    monkeypatch.setattr(dispatch_job, "dispatch_committed", fails_once)
    with Producer(store) as producer:
        producer.send(Message(topic, b"before the failure"))
    stop, out = threading.Event(), {}
    thread = threading.Thread(target=_serve, args=(spark, store, RestartPolicy(max_restarts=2), stop, out))
    thread.start()
    try:
        deadline = time.monotonic() + 120
        while dispatched_version(store) < store.version(schemas.COMMIT_LOG):
            assert thread.is_alive(), out.get("run")
            assert time.monotonic() < deadline, "the restarted dispatch query never dispatched the send"
            time.sleep(0.3)
    finally:
        stop.set()
        thread.join(120)
    run = out["run"]
    assert run.ok, run.failed
    assert run.restarted == {"dispatch": 1} and len(calls) >= 2


@pytest.mark.spark
def test_a_job_that_keeps_failing_stops_the_broker(spark: Any, store: Store, topic: str, monkeypatch: Any):
    def always_fails(s: Store) -> tuple[int, int]:
        raise OSError("injected: the disk is gone")

    monkeypatch.setattr(dispatch_job, "dispatch_committed", always_fails)
    with Producer(store) as producer:
        producer.send(Message(topic, b"never dispatched"))
    stop, out = threading.Event(), {}
    thread = threading.Thread(target=_serve, args=(spark, store, RestartPolicy(max_restarts=1), stop, out))
    thread.start()
    thread.join(180)
    stop.set()
    thread.join(30)
    run = out["run"]
    assert "dispatch" in run.failed and "disk is gone" in run.failed["dispatch"]
    assert run.restarted == {"dispatch": 1}


def test_a_failure_from_a_python_batch_function_is_named_by_its_python_error():
    wrapped = Exception(
        "An exception was raised by the Python Proxy. Return Message: Traceback (most recent call last):\n"
        '  File "dispatch.py", line 172, in on_batch\n'
        "    rows, entries = dispatch_committed(store)\n"
        "OSError: injected: the disk is gone\n"
        "\n\tat org.apache.spark.sql.execution.streaming.Foo.bar(Foo.scala:1)\n"
        "JVM stacktrace:\norg.apache.spark.SparkException: wrapped"
    )
    assert first_line(wrapped) == "OSError: injected: the disk is gone"
    assert first_line(ValueError("one\ntwo")) == "one" and first_line(ValueError()) == "ValueError"
    assert first_line(ValueError("x" * 50), limit=10) == "x" * 10
