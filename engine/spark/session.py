"""The project's SparkSession: settings from ``conf/spark-defaults.conf``, quiet logging, data sources.

Spark is only ever started from here, so every job, notebook and test gets the same settings, the
same Python on the workers and the project's data sources already registered.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from engine.config import conf_dir
from engine.errors import ConfigError
from engine.spark.delta_jars import DELTA_CATALOG, DELTA_EXTENSION, delta_jars
from engine.spark.object_store import object_store_jars, prepare_session
from engine.store.store import Store

DEFAULTS_FILE = "spark-defaults.conf"
LOG4J_FILE = "log4j2.properties"
_JAVA_OPTIONS = "spark.driver.extraJavaOptions"
# "true" on a session whose reads go through Delta on Spark, "false" where the project's own
# ``deltalog`` source serves them; settable at run time (a notebook or a test may turn it off).
DELTA_READS = "spark.lakemq.delta"
_EXTENSIONS = "spark.sql.extensions"
_CATALOG = "spark.sql.catalog.spark_catalog"
# "key value" or "key=value"; a key alone is an error.
_LINE = re.compile(r"^([^\s=]+)\s*[=\s]\s*(\S.*)$")
# Lines a JVM we start prints on stderr that are no business of the user's: Spark's launcher always
# adds ``--add-modules=jdk.incubator.vector`` (JavaModuleOptions) and the JVM announces it at boot,
# and no JVM option mutes that warning. It would sit above every command's one-line answer.
JVM_NOISE = (b"WARNING: Using incubator modules: ",)
_T = TypeVar("_T")


def read_spark_defaults(path: str | os.PathLike[str]) -> dict[str, str]:
    """Parse a ``spark-defaults.conf``: ``key value`` (or ``key=value``) per line, ``#`` comments.

    Raises:
        ConfigError: a line has a key and no value.
    """
    settings: dict[str, str] = {}
    file = Path(path)
    if not file.exists():
        return settings
    for number, raw in enumerate(file.read_text().splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _LINE.match(line)
        if match is None:
            raise ConfigError(f"{file}:{number}: expected 'key value', got {raw!r}", key=line)
        key, value = match.group(1), match.group(2).strip()
        settings[key] = value
    return settings


def _require_java() -> None:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").exists():
        return
    if shutil.which("java") is None:
        raise ConfigError(
            "Spark needs a Java runtime and none was found (no `java` on PATH, JAVA_HOME unset): "
            "install Java 17 (e.g. apt-get install openjdk-17-jre-headless)"
        )


def _with_log4j(options: str | None, log4j: Path) -> str:
    """Add ``-Dlog4j2.configurationFile`` to JVM options unless the user already chose one."""
    opts = options or ""
    if "log4j2.configurationFile" in opts or not log4j.exists():
        return opts
    flag = f"-Dlog4j2.configurationFile={shlex.quote(str(log4j.resolve()))}"
    return f"{opts} {flag}".strip()


def _submitted_settings() -> dict[str, str]:
    """Settings of a JVM that ``spark-submit`` started for this process (empty when there is none).

    Under spark-submit the driver JVM exists before Python does, with ``--master`` and ``--conf``
    as system properties; the defaults file must not override them.
    """
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        return {}
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()  # connects to spark-submit's JVM; starts none
    return {str(k): str(v) for k, v in SparkConf().getAll()}


def _quiet_submitted_jvm(spark: Any) -> None:
    """Load ``conf/log4j2.properties`` into a JVM that spark-submit started with Spark's default logging.

    A JVM started by :func:`session` got it at launch; one started by spark-submit did not, unless the
    user chose a configuration (then it is left alone).
    """
    log4j = conf_dir() / LOG4J_FILE
    jvm = spark.sparkContext._jvm
    if not log4j.exists() or jvm.java.lang.System.getProperty("log4j2.configurationFile") is not None:
        return
    context = jvm.org.apache.logging.log4j.LogManager.getContext(False)
    context.setConfigLocation(jvm.java.io.File(str(log4j.resolve())).toURI())


def _forward_stderr(source: int, target: int) -> None:
    """Copy lines from fd ``source`` to fd ``target`` until end of file, leaving out :data:`JVM_NOISE`."""
    with open(source, "rb", closefd=True) as lines, open(target, "wb", buffering=0, closefd=True) as out:
        for line in lines:
            if not line.startswith(JVM_NOISE):
                try:
                    out.write(line)
                except OSError:  # nobody reads our stderr any more: keep draining the JVM's
                    continue


def without_jvm_noise(launch: Callable[[], _T]) -> _T:
    """Call ``launch`` (which starts a JVM as a child of this process) with stderr (fd 2) going
    through a filter that drops :data:`JVM_NOISE`; the JVM keeps writing through it for its life
    (its own errors and logs still reach stderr), while this process's stderr is direct again once
    ``launch`` returns."""
    try:
        real = os.dup(2)
    except OSError:  # no stderr to protect
        return launch()
    sys.stderr.flush()
    read_end, write_end = os.pipe()
    threading.Thread(target=_forward_stderr, args=(read_end, real), name="jvm-stderr", daemon=True).start()
    saved = os.dup(2)
    os.dup2(write_end, 2)
    os.close(write_end)
    try:
        return launch()
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)  # only the JVM holds the pipe now: the filter ends when the JVM does
        os.close(saved)


def spark_settings(conf: Mapping[str, str] | None = None) -> dict[str, str]:
    """Every setting :func:`session` applies: the defaults file, then ``conf``, plus the log4j flag."""
    directory = conf_dir()
    settings = {
        "spark.master": "local[2]",
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "4",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
    }
    settings.update(read_spark_defaults(directory / DEFAULTS_FILE))
    settings.update({str(k): str(v) for k, v in (conf or {}).items()})
    settings[_JAVA_OPTIONS] = _with_log4j(settings.get(_JAVA_OPTIONS), directory / LOG4J_FILE)
    if not settings[_JAVA_OPTIONS]:
        del settings[_JAVA_OPTIONS]
    return settings


def _with_delta(settings: dict[str, str]) -> dict[str, str]:
    """``settings`` plus the Delta jars, SQL extension and catalog, when the jars can be had."""
    jars = delta_jars()
    if jars is None:
        return {**settings, DELTA_READS: "false"}
    out = _with_jars(settings, jars.spark_jars)
    extensions = [e for e in settings.get(_EXTENSIONS, "").split(",") if e.strip()]
    out[_EXTENSIONS] = ",".join(
        [*extensions, DELTA_EXTENSION] if DELTA_EXTENSION not in extensions else extensions
    )
    out.setdefault(_CATALOG, DELTA_CATALOG)
    out.setdefault(DELTA_READS, "true")
    return out


def _with_jars(settings: dict[str, str], jars: str) -> dict[str, str]:
    return {**settings, "spark.jars": ",".join(j for j in (settings.get("spark.jars"), jars) if j)}


def _with_object_store(settings: dict[str, str], root: str | None) -> dict[str, str]:
    """``settings`` plus the jars Spark needs to read the store at ``root`` (S3A for ``s3://`` and
    ``s3a://``; none for a local store)."""
    jars = object_store_jars(root) if root else None
    return settings if jars is None else _with_jars(settings, jars.spark_jars)


def delta_enabled(spark: Any) -> bool:
    """Whether reads of the store on ``spark`` go through Delta on Spark (``format("delta")``).

    True on a session :func:`session` started with the Delta jars (unless ``spark.lakemq.delta`` was
    set to ``false`` since), and on a session made elsewhere (Databricks, spark-submit with
    ``--packages``) whose ``spark.sql.extensions`` includes Delta's.
    """
    chosen = spark.conf.get(DELTA_READS, None)
    if chosen is not None:
        return str(chosen).strip().lower() == "true"
    return DELTA_EXTENSION in str(spark.conf.get(_EXTENSIONS, None) or "")


def session(
    app_name: str = "lakemq", conf: Mapping[str, str] | None = None, store: Store | None = None
) -> Any:
    """The SparkSession of this process, started with the project's settings if none is running.

    Precedence: ``conf`` > what ``spark-submit`` was given (``--master``, ``--conf``) >
    ``conf/spark-defaults.conf`` (``MQ_CONF_DIR`` moves it) > built-in defaults (local[2], UI off,
    Arrow on). The JVM logs through ``conf/log4j2.properties``. Workers run this interpreter unless
    ``PYSPARK_PYTHON`` says otherwise. The project's data sources (``deltalog``) are registered.
    A session already running in this process is reused (``getOrCreate``) with only ``conf``
    applied to it, so a notebook's own settings are not reset.

    A new session gets Delta Lake (its jars, SQL extension and ``spark_catalog``), fetched on first
    use (:func:`engine.spark.delta_jars.delta_jars`); where they cannot be had it says so in one
    line and the store is read through the ``deltalog`` source instead (:func:`delta_enabled`).

    With ``store`` on S3, a new session also gets the S3A jars (fetched on first use) and the
    session's Hadoop configuration the store's ``fs.s3a.*`` settings
    (:func:`engine.spark.object_store.prepare_session`), so Spark reads the store natively.

    Args:
        app_name: the Spark application name.
        conf: settings that win over the defaults file.
        store: the store the session will read (its root says which file systems it needs).

    Returns:
        pyspark.sql.SparkSession

    Raises:
        ConfigError: no Java runtime, or a malformed defaults file.
    """
    _require_java()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    from engine.spark.datasources import register_data_sources

    explicit = {str(k): str(v) for k, v in (conf or {}).items()}
    submitted: dict[str, str] = {}
    if SparkContext._active_spark_context is not None:
        settings = explicit
    else:
        submitted = _submitted_settings()
        settings = {k: v for k, v in spark_settings(conf).items() if k in explicit or k not in submitted}
        if not submitted:  # a JVM started by spark-submit has its classpath already
            settings = _with_object_store(_with_delta(settings), None if store is None else store.root)
    builder = SparkSession.builder
    if SparkContext._active_spark_context is None:
        builder = builder.appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    if SparkContext._active_spark_context is None and not submitted:
        spark = without_jvm_noise(builder.getOrCreate)  # this call starts the JVM
    else:
        spark = builder.getOrCreate()
    if submitted:
        _quiet_submitted_jvm(spark)
    register_data_sources(spark)
    if store is not None:
        prepare_session(spark, store.root, store.storage_options)
    return spark
