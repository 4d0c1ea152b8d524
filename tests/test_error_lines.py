"""Every CLI error is one line on stderr, the JVM's start-up warning included, and every failing job
names its cause: the root Java exception's class and message, not py4j's "An error occurred while
calling o103.start."."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from engine import Admin, Message, Producer, Store
from engine.spark.jobs.runner import first_line, java_root_cause
from engine.spark.session import JVM_NOISE, without_jvm_noise

# "jobs/dispatch.py: error: org.apache.hadoop.fs.FileAlreadyExistsException: Destination exists ..."
_JAVA_CAUSE = re.compile(r"error: (?:[a-z_][\w$]*\.)+[A-Z][\w$]*(?:Exception|Error): \S")


class _Throwable:
    """A stand-in for a py4j JavaObject of a java.lang.Throwable (no JVM needed)."""

    def __init__(self, name: str, message: str | None, cause: _Throwable | None = None) -> None:
        self.name, self.message, self.cause = name, message, cause

    def getCause(self) -> _Throwable | None:
        return self.cause

    def equals(self, other: object) -> bool:
        return other is self

    def getMessage(self) -> str | None:
        return self.message

    def getClass(self) -> Any:
        name = self.name
        return type("C", (), {"getName": staticmethod(lambda: name)})()


class _Py4JJavaError(Exception):
    def __init__(self, java_exception: _Throwable) -> None:
        super().__init__("An error occurred while calling o103.start.\n")
        self.java_exception = java_exception


def test_a_jvm_error_is_named_by_its_root_cause_class_and_message() -> None:
    root = _Throwable("java.io.IOException", "Destination exists and is not a directory: /x\n\tat ...")
    error = _Py4JJavaError(_Throwable("org.apache.spark.SparkException", "wrapped", root))
    assert java_root_cause(error) == (
        "java.io.IOException",
        "Destination exists and is not a directory: /x\n\tat ...",
    )
    assert first_line(error) == "java.io.IOException: Destination exists and is not a directory: /x"
    assert first_line(_Py4JJavaError(_Throwable("java.lang.NullPointerException", None))) == (
        "java.lang.NullPointerException"
    )


def test_a_python_function_failing_under_the_jvm_is_named_by_its_python_error() -> None:
    proxy = _Throwable(
        "py4j.Py4JException",
        "An exception was raised by the Python Proxy. Return Message: Traceback (most recent call last):\n"
        '  File "dispatch.py", line 1, in on_batch\nOSError: injected: the disk is gone\n',
    )
    assert first_line(_Py4JJavaError(_Throwable("org.apache.spark.SparkException", "x", proxy))) == (
        "OSError: injected: the disk is gone"
    )
    assert java_root_cause(ValueError("plain")) is None


def test_the_jvm_start_up_warning_is_filtered_from_stderr_and_the_rest_passes(tmp_path: Path) -> None:
    script = (
        "import subprocess, sys\n"
        "from engine.spark.session import without_jvm_noise\n"
        "child = without_jvm_noise(lambda: subprocess.Popen([sys.executable, '-c', "
        "\"import sys; sys.stderr.write('WARNING: Using incubator modules: jdk.incubator.vector\\\\n"
        "a real error\\\\n')\"]))\n"
        "child.wait()\n"
        "sys.stderr.write('after\\n')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert sorted(done.stderr.splitlines()) == ["a real error", "after"]
    assert JVM_NOISE and without_jvm_noise(lambda: 7) == 7


def _run_mq(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    env.pop("MQ_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "engine.cli", *argv],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=env,
    )


@pytest.mark.spark
@pytest.mark.slow
def test_mq_sql_refusing_a_delete_prints_exactly_one_line(tmp_path: Path) -> None:
    done = _run_mq("sql", "DELETE FROM commit_log", "--store", str(tmp_path / "mq"))
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr  # no JVM warning above it
    assert done.stderr.startswith("mq: error: mq sql runs queries only")


@pytest.mark.spark
@pytest.mark.slow
def test_a_job_whose_stream_fails_at_start_names_the_java_cause_in_one_line(tmp_path: Path) -> None:
    store = Store.open(str(tmp_path / "mq"))
    Admin(store).create_topic("T", 1)
    with Producer(store) as producer:
        producer.send(Message("T", b"x"))
    checkpoint = tmp_path / "checkpoint"
    checkpoint.write_text("a file where the job wants a directory")
    done = _run_mq("dispatch", "--once", "--checkpoint", str(checkpoint), "--store", store.root)
    assert done.returncode == 1
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("jobs/dispatch.py: error: ") and _JAVA_CAUSE.search(line), line
    assert "An error occurred while calling" not in line and str(checkpoint) in line
