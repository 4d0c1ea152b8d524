"""Spark on a store on S3: the S3A settings, native reads by scheme, local default checkpoints, and
the broker jobs run against the S3 server with Spark holding a READ-ONLY identity."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from engine import Admin, Message, Producer, Store
from engine.config import conf_dir
from engine.spark import object_store
from engine.spark.jobs.streams import checkpoint_location
from engine.spark.mq_options import ReadingStore, StoreRef
from engine.store.consume_queue import QueueIndex

ROOT = Path(__file__).resolve().parent.parent
OPTIONS = {
    "AWS_ENDPOINT_URL": "http://127.0.0.1:8333",
    "AWS_ACCESS_KEY_ID": "AKID",
    "AWS_SECRET_ACCESS_KEY": "sekrit-value",
    "AWS_REGION": "us-east-1",
    "AWS_ALLOW_HTTP": "true",
}


# ----------------------------------------------------------------------------- settings
def test_s3a_settings_map_the_storage_options_with_static_keys_and_s3_on_s3a() -> None:
    got = object_store.s3a_settings(OPTIONS)
    assert got["fs.s3a.endpoint"] == "http://127.0.0.1:8333"
    assert got["fs.s3a.connection.ssl.enabled"] == "false"
    assert got["fs.s3a.endpoint.region"] == "us-east-1"
    assert got["fs.s3a.path.style.access"] == "true"
    assert (got["fs.s3a.access.key"], got["fs.s3a.secret.key"]) == ("AKID", "sekrit-value")
    assert got["fs.s3a.aws.credentials.provider"] == "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
    assert got["fs.s3.impl"] == object_store.S3A_FILESYSTEM


def test_s3a_settings_take_delta_rs_lower_case_names_and_virtual_hosted_style() -> None:
    got = object_store.s3a_settings(
        {"aws_access_key_id": "a", "aws_secret_access_key": "b", "aws_session_token": "t",
         "aws_virtual_hosted_style_request": "true"}
    )  # fmt: skip
    assert got["fs.s3a.path.style.access"] == "false"
    assert got["fs.s3a.session.token"] == "t"
    assert got["fs.s3a.aws.credentials.provider"].endswith("TemporaryAWSCredentialsProvider")
    assert "fs.s3a.endpoint" not in got


def test_every_secret_setting_is_redacted_by_sparks_default_redaction_regex() -> None:
    redaction = re.compile(r"(?i)secret|password|token|access[.]?key")  # spark.redaction.regex's default
    got = object_store.s3a_settings({**OPTIONS, "AWS_SESSION_TOKEN": "tok"})
    secrets = {k for k, v in got.items() if v in ("AKID", "sekrit-value", "tok")}
    assert secrets == {"fs.s3a.access.key", "fs.s3a.secret.key", "fs.s3a.session.token"}
    assert all(redaction.search(f"spark.hadoop.{k}") for k in secrets)


def test_hadoop_aws_matches_the_hadoop_pyspark_bundles() -> None:
    import pyspark

    (api,) = (Path(pyspark.__file__).parent / "jars").glob("hadoop-client-api-*.jar")
    version = api.name.removeprefix("hadoop-client-api-").removesuffix(".jar")
    assert object_store.hadoop_aws_coordinate() == f"org.apache.hadoop:hadoop-aws:{version}"


def test_local_stores_need_no_object_store_jars() -> None:
    assert object_store.object_store_jars("/tmp/mqdata") is None
    assert object_store.object_store_jars("file:///tmp/mqdata") is None
    assert object_store.is_s3("s3a://b/x") and object_store.is_s3("S3://b/x")
    assert not object_store.is_s3("gs://b/x")


def test_store_root_of_a_command_line_is_its_last_store(monkeypatch: pytest.MonkeyPatch) -> None:
    assert object_store.store_root_of(["--master", "x", "jobs/d.py", "--store", "s3a://b/s"]) == "s3a://b/s"
    assert object_store.store_root_of(["jobs/d.py", "--store=s3://b/t", "--once"]) == "s3://b/t"
    monkeypatch.setenv("MQ_STORE", "s3a://env/store")
    assert object_store.store_root_of(["jobs/d.py", "--once"]) == "s3a://env/store"


def test_spark_submit_args_add_s3a_jars_to_the_one_jars_option_for_an_s3_store_only(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    jar = tmp_path / "hadoop-aws.jar"
    monkeypatch.setattr(object_store, "delta_submit_args", lambda: ["--jars", "/d.jar", "--conf", "x=y"])
    s3a = object_store.DeltaJars("c", (jar,))
    monkeypatch.setattr(object_store, "object_store_jars", lambda root: s3a if "s3" in root else None)
    assert object_store.spark_submit_args(["j.py", "--store", "s3a://b/s"]) == [
        "--jars", f"/d.jar,{jar}", "--conf", "x=y"
    ]  # fmt: skip
    local = object_store.spark_submit_args(["j.py", "--store", "/local"])
    assert local == ["--jars", "/d.jar", "--conf", "x=y"]


class _Conf:
    def __init__(self, given: dict[str, str]) -> None:
        self.given = given

    def contains(self, key: str) -> bool:
        return key in self.given


class _FakeSpark:
    """What prepare_session touches of a SparkSession."""

    def __init__(self, given: dict[str, str], loadable: bool = True) -> None:
        self.hadoop: dict[str, str] = {}
        outer = self

        class Jsc:
            def hadoopConfiguration(self) -> Any:
                class H:
                    def set(self, k: str, v: str) -> None:
                        outer.hadoop[k] = v

                return H()

        class Utils:
            @staticmethod
            def classForName(name: str, *a: Any) -> None:
                if not loadable:
                    raise RuntimeError("ClassNotFoundException")

        class Jvm:
            class org:
                class apache:
                    class spark:
                        class util:
                            pass

        Jvm.org.apache.spark.util.Utils = Utils  # type: ignore[attr-defined]

        class Sc:
            applicationId = f"app-{id(outer)}"
            _jvm = Jvm
            _jsc = Jsc()

            def getConf(self) -> _Conf:
                return _Conf(given)

        self.sparkContext = Sc()


def test_prepare_session_sets_hadoop_conf_but_a_users_spark_hadoop_setting_wins() -> None:
    spark = _FakeSpark({"spark.hadoop.fs.s3a.access.key": "x", "spark.hadoop.fs.s3a.secret.key": "y"})
    assert object_store.prepare_session(spark, "s3a://b/store", OPTIONS)
    assert spark.hadoop["fs.s3a.endpoint"] == "http://127.0.0.1:8333"
    assert "fs.s3a.access.key" not in spark.hadoop and "fs.s3a.secret.key" not in spark.hadoop


def test_prepare_session_by_scheme() -> None:
    assert object_store.prepare_session(_FakeSpark({}), "/local/store", OPTIONS)
    assert not object_store.prepare_session(_FakeSpark({}), "gs://b/store", OPTIONS)
    assert not object_store.prepare_session(_FakeSpark({}, loadable=False), "s3://b/store", OPTIONS)


@pytest.mark.spark
def test_native_reads_go_by_scheme_not_by_storage_options(spark: Any, tmp_path: Path) -> None:
    from engine.spark.session import delta_enabled
    from engine.spark.views import native_reads

    if not delta_enabled(spark):
        pytest.skip("Delta on Spark is off")
    local = Store.open(tmp_path / "mqdata")
    local.storage_options = {"AWS_REGION": "x"}  # options on a local store change nothing
    assert native_reads(spark, local)
    remote = Store(
        "gs://bucket/store", {"GOOGLE_SERVICE_ACCOUNT": "x"}, local.config
    )  # never opened: only its scheme is asked
    assert not native_reads(spark, remote)


def test_default_checkpoints_of_an_object_store_store_are_local(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    remote = Store("s3a://bucket/store", OPTIONS, Store.open(tmp_path / "l").config)
    remote._store_id = "ABCD"  # never opened: its id would need the server
    assert checkpoint_location(remote, "dispatch") == f"{tmp_path}/cache/lakemq/checkpoints/ABCD/dispatch"
    assert checkpoint_location(remote, "dispatch", "s3a://bucket/ckpt") == "s3a://bucket/ckpt"
    local = Store.open(tmp_path / "mqdata")
    assert checkpoint_location(local, "index") == f"{local.root}/_checkpoints/index"


# ----------------------------------------------------------------------------- on the S3 server
@pytest.mark.s3
def test_a_spark_task_reads_through_a_reading_store_that_creates_nothing(
    s3_store: Store, s3_options: dict[str, str]
) -> None:
    Admin(s3_store).create_topic("T", 2)
    ref = StoreRef.of(s3_store.root, s3_options)
    reader = ref.reader()
    assert isinstance(reader, ReadingStore) and ref.reader() is reader
    assert reader.commit_log_shards == 1
    assert reader.topic("T").queues == 2


def test_a_store_ref_carries_the_drivers_storage_options_to_executors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MQ_STORAGE_AWS_ENDPOINT_URL", "http://from-env:1")
    monkeypatch.setenv("MQ_STORAGE_AWS_REGION", "from-env")
    options = StoreRef.of("s3a://b/s", {"AWS_REGION": "r"}).storage_options or {}
    assert (options["AWS_ENDPOINT_URL"], options["AWS_REGION"]) == ("http://from-env:1", "r")
    assert StoreRef.of("/local/store").storage_options is None


def _spark_conf_dir(tmp_path: Path, extra: dict[str, str]) -> Path:
    """A copy of the project's conf directory whose spark-defaults.conf also holds ``extra``."""
    conf = tmp_path / "conf"
    shutil.copytree(conf_dir(), conf)
    with open(conf / "spark-defaults.conf", "a") as out:
        out.writelines(f"{k} {v}\n" for k, v in extra.items())
    return conf


def job_env(server: Any, tmp_path: Path, *, spark_identity: Any = None) -> dict[str, str]:
    """The environment of a job subprocess: the store's (admin) storage options as MQ_STORAGE_*, a
    cache of its own for checkpoints, and, with ``spark_identity``, that identity for Spark's S3A."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MQ_") and not k.startswith("AWS_")}
    env.update({f"MQ_STORAGE_{k}": v for k, v in server.storage_options().items()})
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    env["PYTHONPATH"] = str(ROOT)
    if spark_identity is not None:
        extra = {
            "spark.hadoop.fs.s3a.access.key": spark_identity.access_key,
            "spark.hadoop.fs.s3a.secret.key": spark_identity.secret_key,
        }
        env["MQ_CONF_DIR"] = str(_spark_conf_dir(tmp_path, extra))
    return env


def filled_store(root: str, options: dict[str, str], count: int = 6) -> Store:
    store = Store.open(root, storage_options=options)
    Admin(store).create_topic("Orders", 2)
    with Producer(store) as producer:
        for i in range(count):
            producer.send(Message("Orders", f"order {i}".encode(), keys=[f"k{i}"]), queue_id=i % 2)
    return store


def dispatched(store: Store, topic: str, queues: int) -> int:
    index = QueueIndex(Store.open(store.root, storage_options=store.storage_options))
    index.refresh()
    return sum(index.bounds(topic, q)[1] for q in range(queues))


@pytest.mark.s3
@pytest.mark.spark
@pytest.mark.slow
def test_broker_jobs_run_on_s3a_with_spark_holding_a_read_only_identity(
    s3_server: Any, s3_bucket: str, tmp_path: Path
) -> None:
    root = f"s3a://{s3_bucket}/readonly-{tmp_path.name}"
    store = filled_store(root, s3_server.storage_options())
    env = job_env(s3_server, tmp_path, spark_identity=s3_server.reader)
    done = subprocess.run(
        [sys.executable, "jobs/broker.py", "--store", root, "--once"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "broker: ran dispatch, index" in done.stdout, done.stdout[-2000:]
    assert dispatched(store, "Orders", 2) == 6
    # Spark's Delta streams ran natively; their checkpoints are local, under the cache given
    assert list((tmp_path / "cache" / "lakemq" / "checkpoints").glob("*/retry/delta/from-*/offsets"))
    assert s3_server.reader.secret_key not in done.stdout + done.stderr
    assert s3_server.admin.secret_key not in done.stdout + done.stderr

    # The same identity cannot write: a checkpoint on the store, asked for, fails in one line.
    failed = subprocess.run(
        [sys.executable, "jobs/dispatch.py", "--store", root, "--once",
         "--checkpoint", f"{root}/_checkpoints/dispatch"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert failed.returncode != 0
    errors = [line for line in failed.stderr.splitlines() if line.startswith("jobs/dispatch.py: error:")]
    assert len(errors) == 1, failed.stderr[-3000:]


# ----------------------------------------------------------------------------- the README's examples
README = ROOT / "README.md"


def readme_block(kind: str, language: str) -> str:
    """The README's one ``language`` block marked ``<!-- test: kind -->``."""
    pattern = rf"<!-- test: {re.escape(kind)} -->\s*\n```{language}\n(?P<code>.*?)\n```"
    [code] = [m.group("code") for m in re.finditer(pattern, README.read_text(), re.DOTALL)]
    return code


def readme_env(server: Any, root: str, tmp_path: Path) -> dict[str, str]:
    """The variables the README's object-store examples read, pointed at the test server."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MQ_", "AWS_")) and k != "COLUMNS"}
    env.update(
        MQ_S3_STORE=root,
        AWS_ENDPOINT_URL=server.endpoint,
        AWS_ACCESS_KEY_ID=server.admin.access_key,
        AWS_SECRET_ACCESS_KEY=server.admin.secret_key,
        XDG_CACHE_HOME=str(tmp_path / "cache"),
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    )
    return env


def run_readme_python(server: Any, root: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run the README's ``s3`` Python example against ``server`` at ``root``."""
    for key, value in readme_env(server, root, tmp_path).items():
        monkeypatch.setenv(key, value)
    namespace: dict[str, Any] = {"__name__": "readme"}
    exec(compile(readme_block("s3", "python"), str(README), "exec"), namespace)


@pytest.mark.s3
def test_readme_object_store_example_runs(
    s3_server: Any, s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    root = f"s3a://{s3_bucket}/readme-{tmp_path.name}"
    run_readme_python(s3_server, root, tmp_path, monkeypatch)
    assert capsys.readouterr().out.strip()  # the message id
    store = Store.open(root, storage_options=s3_server.storage_options())
    assert store.topic("Orders").queues == 2


def test_s3a_jars_that_cannot_be_had_are_said_once_and_not_fetched_again(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from engine.errors import ConfigError

    calls: list[str] = []

    def failing(coordinate: str) -> Any:
        calls.append(coordinate)
        raise ConfigError(f"could not fetch {coordinate}")

    monkeypatch.setattr(object_store, "cached_jars", lambda coordinate: None)
    monkeypatch.setattr(object_store, "fetch_jars", failing)
    monkeypatch.setattr(object_store, "_failed", set())
    assert object_store.object_store_jars("s3a://b/s") is None
    assert object_store.object_store_jars("s3://b/s") is None
    assert len(calls) == 1
    assert capsys.readouterr().err.count("Spark cannot read s3a:// natively") == 1


def test_a_fetch_keeps_the_retrieved_jars_and_drops_ivys_second_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from engine.spark import delta_jars

    fake = tmp_path / "spark-submit"  # does what Spark's resolver does: a download cache, then retrieval
    fake.write_text(
        "#!/bin/bash\n"
        'ivy=$(printf "%s\\n" "$@" | sed -n "s/^spark.jars.ivy=//p")\n'
        'mkdir -p "$ivy/cache/g" "$ivy/jars"\n'
        'echo x > "$ivy/cache/g/a.jar"\n'
        'echo x > "$ivy/jars/g_a.jar"\n'
    )
    fake.chmod(0o755)
    monkeypatch.setattr(delta_jars, "_spark_submit", lambda: fake)
    got = delta_jars.fetch_jars("g:a:1", tmp_path / "jars")
    [jar] = got.paths
    assert jar.name == "g_a.jar" and jar.is_file()
    assert not (jar.parent.parent / "cache").exists()
    assert delta_jars.cached_jars("g:a:1", tmp_path / "jars") == got
