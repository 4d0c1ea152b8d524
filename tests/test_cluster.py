"""The broker jobs, replay, the SQL views and the ``mq`` source and sink on a Spark standalone cluster
(a master and two workers on 127.0.0.1, :mod:`tests.cluster`) over a store on S3, with their tasks
on executors; the sink stays exactly once when an executor is killed in the middle of a write. The
jobs (``spark-submit.sh --master``) and ``mq sql --master`` run as the README shows them.

Everything Spark does here runs in subprocesses, as users run it: ``spark-submit --master`` for the
jobs, a Python process whose session names the master for the rest.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from engine import Admin, Store
from engine.store import schemas
from tests.test_spark_object_store import (
    ROOT,
    job_env,
    readme_block,
    readme_env,
    run_readme_python,
)

pytestmark = [pytest.mark.cluster, pytest.mark.s3, pytest.mark.spark, pytest.mark.slow]


def bodies(store: Store) -> list[bytes]:
    """Every message body the store's commit log holds (one entry per stored row)."""
    found: list[bytes] = []
    wanted = pa.schema([schemas.COMMIT_LOG_SCHEMA.field("body")])
    fresh = Store.open(store.root, storage_options=store.storage_options)
    for rows, _ in fresh.versions_after(schemas.COMMIT_LOG, -1, wanted):
        found.extend(rows["body"].to_pylist())
    return found


def running_executor(executors: list[int], pid: int) -> int | None:
    """The executor among ``executors`` that ``pid`` descends from (its Python workers are forked by a
    daemon the executor started), or None when the process is gone or belongs to none of them."""
    while pid > 1:
        if pid in executors:
            return pid
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return None
        pid = int(stat.rsplit(")", 1)[1].split()[1])  # the parent's pid follows the state field
    return None


_SINK_SCRIPT = """
import os, sys, time
from pathlib import Path
from engine import Store
from engine.broker.dispatch import dispatch_pending
from engine.spark import session, register_views
from engine.spark.replay import replay

root, master, marks = sys.argv[1], sys.argv[2], Path(sys.argv[3])
rows, hold_s = int(sys.argv[4]), float(sys.argv[5])
store = Store.open(root)
spark = session(
    app_name="lakemq-cluster-sink",
    conf={"spark.master": master, "spark.executor.memory": "768m", "spark.sql.shuffle.partitions": "4"},
    store=store,
)
def held(ids):
    # Runs in the executors: says it started, then holds the task so the test can kill its executor.
    (marks / f"started-{os.getpid()}-{time.time_ns()}").touch()
    time.sleep(hold_s)
    for i in ids:
        yield ("Orders", f"row-{i}")

rdd = spark.sparkContext.parallelize(range(rows), 4).mapPartitions(held)
frame = spark.createDataFrame(rdd, "topic string, body string")
(frame.write.format("mq").mode("append").option("store", root)
    .option("sinkId", "cluster-sink").option("batchId", "0").save())
print("WROTE", flush=True)
dispatch_pending(store)
print("REPLAY", replay(spark, store, "Orders").count(), flush=True)
register_views(spark, store)
print("SQL", spark.sql("SELECT count(DISTINCT body) AS n FROM messages").collect()[0].n, flush=True)
read = spark.read.format("mq").option("store", root).option("topic", "Orders").load()
print("SOURCE", read.select("body").distinct().count(), flush=True)
"""


def test_the_sink_stays_exactly_once_when_an_executor_is_killed_mid_write(
    spark_cluster: Any, s3_server: Any, s3_bucket: str, tmp_path: Path
) -> None:
    root = f"s3://{s3_bucket}/cluster-sink-{tmp_path.name}"  # s3:// is read through S3A too
    store = Store.open(root, storage_options=s3_server.storage_options())
    Admin(store).create_topic("Orders", 4)
    marks = tmp_path / "marks"
    marks.mkdir()
    rows = 400
    script = tmp_path / "sink.py"
    script.write_text(_SINK_SCRIPT)
    errors = tmp_path / "sink.err"
    with errors.open("w") as err_file:  # a file: nobody reads a pipe while the job runs (Spark logs)
        job = subprocess.Popen(
            [sys.executable, str(script), root, spark_cluster.url, str(marks), str(rows), "6"],
            cwd=ROOT, env=job_env(s3_server, tmp_path), stdout=subprocess.PIPE, stderr=err_file, text=True,
        )  # fmt: skip
    killed = None
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and job.poll() is None and killed is None:
            for mark in marks.iterdir():
                # the executor running that task: an ancestor of the Python worker that made the mark
                killed = running_executor(spark_cluster.executor_pids(), int(mark.name.split("-")[1]))
                if killed is not None:
                    os.kill(killed, signal.SIGKILL)  # a task of the write is running: kill its executor
                    break
            time.sleep(0.2)
        out, _ = job.communicate(timeout=600)
    finally:
        if job.poll() is None:
            job.kill()
    err = errors.read_text()
    assert killed is not None, "no executor was running the write: " + err[-3000:]
    assert job.returncode == 0, err[-4000:]
    assert "WROTE" in out, out
    assert len(list(marks.iterdir())) > 4  # a killed task ran again: 4 partitions, more starts
    stored = bodies(store)
    assert len(stored) == rows  # each row once: the killed attempt's staged rows never committed
    assert sorted(stored) == sorted(f"row-{i}".encode() for i in range(rows))
    assert f"REPLAY {rows}" in out and f"SQL {rows}" in out and f"SOURCE {rows}" in out, out


def test_readme_object_store_and_cluster_examples_run(
    spark_cluster: Any, s3_server: Any, s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = f"s3a://{s3_bucket}/readme-cluster-{tmp_path.name}"
    run_readme_python(s3_server, root, tmp_path, monkeypatch)
    before = set(spark_cluster.executor_logs())
    env = {**readme_env(s3_server, root, tmp_path), "SPARK_MASTER": spark_cluster.url}
    # The block runs from "the repository's root": here a directory of its own whose spark-submit.sh
    # and jobs/ are the repository's, so Spark's leftovers (spark-warehouse/) stay out of it.
    work = tmp_path / "work"
    work.mkdir()
    (work / "jobs").symlink_to(ROOT / "jobs")
    (work / "spark-submit.sh").write_text(f'#!/bin/bash\nexec {ROOT / "spark-submit.sh"} "$@"\n')
    (work / "spark-submit.sh").chmod(0o755)
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", readme_block("s3-cluster", "bash")],
        cwd=work, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert re.search(r"Orders\s*│\s*2", done.stdout), done.stdout
    assert "order 8 paid" in done.stdout, done.stdout
    assert s3_server.admin.secret_key not in done.stdout + done.stderr
    assert len(set(spark_cluster.executor_logs()) - before) >= 2  # the jobs' and mq sql's executors
