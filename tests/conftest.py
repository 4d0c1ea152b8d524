"""Shared fixtures: a fresh store per test in tmp_path, one SparkSession per test run."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# pytest-xdist's workers start with COLUMNS=80 in their environment (a plain run has none): the
# CLI would then cut its tables at 80 columns in a worker only. Tests that mean a width set it.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.pop("COLUMNS", None)

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

from engine import Admin, Store
from tests.helpers import start_seaweed

# The fault suite's FAULTS.md report, a plugin so that it also runs in a pytest-xdist controller.
pytest_plugins = ["tests.fault.report"]

# The JVMs the tests start in other processes (mq sql, spark-submit jobs, notebook kernels) live for
# seconds: with the JIT's first tier only they start and warm up about a fifth faster. A performance
# setting only (no result depends on it); this process's own session keeps the default (see spark()).
_SUBMIT_OPTS, _SHORT_JVM = "SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1"
os.environ.setdefault(_SUBMIT_OPTS, _SHORT_JVM)


@pytest.fixture
def store(tmp_path: Path) -> Store:
    """An empty store in a temporary directory."""
    return Store.open(tmp_path / "mqdata")


@pytest.fixture
def admin(store: Store) -> Admin:
    return Admin(store)


@pytest.fixture
def topic(admin: Admin) -> str:
    """A topic named ``T`` with 4 queues."""
    admin.create_topic("T", 4)
    return "T"


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local SparkSession for the whole run (local[2], few partitions, UI off)."""
    from engine.spark import session

    mine = os.environ.get(_SUBMIT_OPTS)
    if mine == _SHORT_JVM:
        del os.environ[_SUBMIT_OPTS]  # the long-lived session of the run keeps the full JIT
    try:
        spark = session(
            app_name="lakemq-tests",
            conf={
                "spark.master": "local[2]",
                "spark.sql.shuffle.partitions": "2",
                "spark.ui.enabled": "false",
            },
        )
    finally:
        if mine is not None:
            os.environ[_SUBMIT_OPTS] = mine
    yield spark
    spark.stop()


@pytest.fixture(params=["delta", "deltalog"])
def spark_reads(request: pytest.FixtureRequest, spark: Any) -> Iterator[Any]:
    """The session, once reading the store through Delta on Spark (skipped where the jars could not be
    fetched) and once through the project's own ``deltalog`` / ``mq`` sources (the fallback)."""
    from engine.spark.session import DELTA_READS, delta_enabled

    before = spark.conf.get(DELTA_READS, None)
    if request.param == "delta" and not delta_enabled(spark):
        if os.environ.get("CI") == "true":
            pytest.fail("Delta on Spark is off: the Delta jars could not be fetched")
        pytest.skip("Delta on Spark is off: the Delta jars could not be fetched")
    spark.conf.set(DELTA_READS, "true" if request.param == "delta" else "false")
    try:
        yield spark
    finally:
        if before is None:
            spark.conf.unset(DELTA_READS)
        else:
            spark.conf.set(DELTA_READS, before)


# ----------------------------------------------------------------------------- object storage
@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One SeaweedFS S3 server for the whole run on 127.0.0.1 (static keys, conditional PUTs probed).

    ``.ci/run`` builds its binary first; elsewhere the first use builds it (minutes, then cached).
    Where it cannot be built or started the object-store tests skip — except under CI, where that
    is a failure.
    """
    server = start_seaweed(tmp_path_factory.mktemp("seaweedfs"))
    yield server
    server.stop(grace_s=2)  # its data goes with the run: no need to wait out weed's 15 s shutdown


@pytest.fixture(scope="session")
def s3_bucket(s3_server: Any) -> str:
    """The run's bucket; every test takes a prefix of its own in it (:func:`s3_root`)."""
    return str(s3_server.create_bucket("lakemq-tests"))


@pytest.fixture
def s3_root(s3_bucket: str, request: pytest.FixtureRequest) -> str:
    """A fresh ``s3://`` store root for one test (a unique prefix in the run's bucket)."""
    name = "".join(c if c.isalnum() else "-" for c in request.node.name)[:60]
    return f"s3://{s3_bucket}/{name}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def s3_options(s3_server: Any) -> dict[str, str]:
    """delta-rs storage options of the run's S3 server (admin keys)."""
    return dict(s3_server.storage_options())


@pytest.fixture
def s3_proxy(s3_server: Any) -> Iterator[Any]:
    """A fault- and latency-injecting proxy (:class:`bench.s3proxy.S3Proxy`) in front of the run's
    S3 server, for one test; point storage options at ``s3_server.storage_options(endpoint=...)``."""
    from bench.s3proxy import S3Proxy

    with S3Proxy(s3_server.endpoint) as proxy:
        yield proxy


@pytest.fixture
def s3_store(s3_root: str, s3_options: dict[str, str]) -> Store:
    """An empty store on the S3 server."""
    return Store.open(s3_root, storage_options=s3_options)


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    """An empty store, once in a local directory and once on the S3 server (CONVENTIONS 14: where
    the two differ the object-store path is the reference, and both are tested)."""
    if request.param == "local":
        return Store.open(tmp_path / "mqdata")
    return Store.open(
        request.getfixturevalue("s3_root"), storage_options=request.getfixturevalue("s3_options")
    )


# The run's exit status, kept for pytest_unconfigure (see there).
_EXIT_STATUS: list[int] = []


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _EXIT_STATUS.append(int(exitstatus))


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """Leave with pytest's own exit status, without the interpreter's teardown: pyarrow's and
    delta-rs's threads can crash it after the run is over (a run of 454 tests, all reported, exited
    139 = SIGSEGV after its summary), which would turn a finished run red. Every report, FAULTS.md
    and the summary are written by then; ``bench/run.py`` and the CLI leave the same way."""
    if _EXIT_STATUS:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_EXIT_STATUS[-1])


# ----------------------------------------------------------------------------- Spark cluster
@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One Spark standalone cluster for the whole run: a master and two workers (1 core, 1 GiB each)
    on 127.0.0.1 (``spark://127.0.0.1:7077`` when the port is free), stopped after the run. Work for
    it runs in subprocesses (``--master cluster.url``): this process keeps its one local session."""
    from tests.cluster import ClusterUnavailable, SparkCluster

    cluster = SparkCluster(tmp_path_factory.mktemp("spark-cluster"))
    try:
        cluster.start()
    except ClusterUnavailable as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(str(exc))
        pytest.skip(str(exc))
    yield cluster
    cluster.stop()
