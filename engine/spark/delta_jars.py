"""The Delta Lake JVM jars: which ones match the installed pyspark and delta-spark, fetched once, cached.

Like the virtualenv, the jars are set up on first use: Spark's own Maven resolver (``spark-submit
--packages``, run once in a child process with its output captured) downloads ``delta-spark`` and its
dependencies into a cache directory, and every later session puts the cached jars on its classpath
(``spark.jars``) without touching the network. The cache lives beside the virtualenv
(``<venv>/lakemq-jars``) unless ``MQ_JARS_DIR`` says otherwise, so a fresh virtualenv (as CI builds)
fetches them from nothing.

Where the jars cannot be had (no network, ``MQ_DELTA=off``) :func:`delta_jars` returns ``None`` and
says why in one line on stderr; the project's own ``deltalog`` data source then serves every read.
"""

from __future__ import annotations

import fcntl
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from engine.errors import ConfigError

# Delta's SQL extension and catalog: what `spark.read.format("delta")`, DESCRIBE HISTORY and time
# travel need on a session.
DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
DELTA_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
SCALA_VERSION = "2.13"
_MANIFEST = "jars.txt"
_FETCH_TIMEOUT_S = 600.0
_OFF = ("0", "off", "false", "no")

# One attempt per process: a machine without Maven Central is not asked again for every session.
_failed: dict[str, str] = {}


@dataclass(frozen=True)
class DeltaJars:
    """The Delta Lake jars of one ``delta-spark`` release, fetched and ready for ``spark.jars``.

    Attributes:
        coordinate: the Maven coordinate resolved (``io.delta:delta-spark_4.2_2.13:4.4.0``).
        paths: every jar of its dependency closure, in the cache.
    """

    coordinate: str
    paths: tuple[Path, ...]

    @property
    def spark_jars(self) -> str:
        """The jars as Spark's ``spark.jars`` setting (comma-separated paths)."""
        return ",".join(str(p) for p in self.paths)


def delta_coordinate(spark_version: str | None = None, delta_version: str | None = None) -> str:
    """The Maven coordinate of the ``delta-spark`` jar built for this pyspark.

    From Delta 4.1 on the artifact names Spark's major.minor (``delta-spark_4.2_2.13``), the scheme
    ``delta.pip_utils.configure_spark_with_delta_pip`` uses.

    Args:
        spark_version: pyspark's version (default: the installed one).
        delta_version: delta-spark's version (default: the installed one).

    Raises:
        ConfigError: delta-spark is not installed, or a version is not ``major.minor[...]``.
    """
    if spark_version is None:
        import pyspark

        spark_version = pyspark.__version__
    if delta_version is None:
        try:
            delta_version = importlib.metadata.version("delta-spark")
        except importlib.metadata.PackageNotFoundError as exc:
            raise ConfigError(
                "delta-spark is not installed (it is a dependency of lakemq: pip install -e .)",
                key="delta-spark",
            ) from exc
    parts = spark_version.split(".")
    if len(parts) < 2 or not all(p.isdigit() for p in parts[:2]) or not delta_version[:1].isdigit():
        raise ConfigError(
            f"cannot derive the Delta jar from pyspark {spark_version!r} and delta-spark {delta_version!r}",
            key="delta-spark",
        )
    return f"io.delta:delta-spark_{parts[0]}.{parts[1]}_{SCALA_VERSION}:{delta_version}"


def jars_dir() -> Path:
    """The jar cache: ``MQ_JARS_DIR`` if set, else ``lakemq-jars`` in the running virtualenv."""
    env = os.environ.get("MQ_JARS_DIR")
    return Path(env) if env else Path(sys.prefix) / "lakemq-jars"


def delta_disabled() -> bool:
    """True when ``MQ_DELTA`` turns Delta on Spark off (``0``, ``off``, ``false``, ``no``)."""
    return os.environ.get("MQ_DELTA", "").strip().lower() in _OFF


def _cache_for(coordinate: str, root: Path) -> Path:
    return root / coordinate.replace(":", "_")


def cached_jars(coordinate: str, root: Path | None = None) -> DeltaJars | None:
    """The jars of ``coordinate`` if a previous fetch left them all in the cache, else ``None``."""
    manifest = _cache_for(coordinate, root or jars_dir()) / _MANIFEST
    if not manifest.exists():
        return None
    paths = tuple(Path(line) for line in manifest.read_text().splitlines() if line.strip())
    if not paths or not all(p.is_file() for p in paths):
        return None
    return DeltaJars(coordinate, paths)


def _spark_submit() -> Path:
    from pyspark.find_spark_home import _find_spark_home

    return Path(_find_spark_home()) / "bin" / "spark-submit"


def fetch_jars(coordinate: str, root: Path | None = None, timeout_s: float = _FETCH_TIMEOUT_S) -> DeltaJars:
    """Download ``coordinate`` and its dependencies into the cache (Spark's Maven resolver, in a child
    process) and return them. Safe to call from several processes at once (a file lock serialises
    them; the second finds the first one's jars).

    Raises:
        ConfigError: the resolver failed or timed out (no network, unknown coordinate); the message
            carries the resolver's last output line.
    """
    cache = _cache_for(coordinate, root or jars_dir())
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = cached_jars(coordinate, root)
        if found is not None:
            return found
        with tempfile.TemporaryDirectory(prefix="lakemq-fetch-") as tmp:
            noop = Path(tmp) / "noop.py"
            noop.write_text("")  # spark-submit resolves --packages before it runs the (empty) app
            command = [
                str(_spark_submit()),
                "--master",
                "local[1]",
                "--conf",
                f"spark.jars.ivy={cache / 'ivy'}",
                "--packages",
                coordinate,
                str(noop),
            ]
            env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_CONF_DIR=tmp)
            env.pop("PYSPARK_GATEWAY_PORT", None)
            env.pop("PYSPARK_GATEWAY_SECRET", None)
            try:
                done = subprocess.run(
                    command, env=env, capture_output=True, text=True, timeout=timeout_s, check=False
                )
            except subprocess.TimeoutExpired as exc:
                raise ConfigError(
                    f"fetching {coordinate} took longer than {timeout_s:.0f}s", key=coordinate
                ) from exc
        jars = sorted((cache / "ivy" / "jars").glob("*.jar"))
        if done.returncode != 0 or not jars:
            lines = [line.strip() for line in (done.stderr + done.stdout).splitlines() if line.strip()]
            errors = [line for line in lines if "unresolved" in line.lower() or "error" in line.lower()]
            last = (errors or lines or ["no output"])[-1]
            raise ConfigError(
                f"could not fetch {coordinate} (spark-submit exited {done.returncode}: {last})",
                key=coordinate,
            )
        (cache / _MANIFEST).write_text("".join(f"{p}\n" for p in jars))
        # Ivy's download cache holds a second copy of every jar retrieved (the S3A bundle alone is
        # ~700 MB); the manifest names the retrieved ones only.
        shutil.rmtree(cache / "ivy" / "cache", ignore_errors=True)
        return DeltaJars(coordinate, tuple(jars))


def delta_jars() -> DeltaJars | None:
    """The Delta jars for this pyspark, fetched on first use; ``None`` (with one line on stderr saying
    why) when Delta on Spark is turned off or the jars cannot be fetched."""
    if delta_disabled():
        return None
    try:
        coordinate = delta_coordinate()
    except ConfigError as exc:
        _say_once("delta-spark", str(exc))
        return None
    found = cached_jars(coordinate)
    if found is not None:
        return found
    if coordinate in _failed:
        return None
    print(f"lakemq: fetching the Delta Lake jars ({coordinate}; first use only) ...", file=sys.stderr)
    try:
        return fetch_jars(coordinate)
    except ConfigError as exc:
        _say_once(coordinate, str(exc))
        return None


def _say_once(key: str, reason: str) -> None:
    if key not in _failed:
        _failed[key] = reason
        print(
            f"lakemq: Delta on Spark is off ({reason}); Spark reads the store through the "
            "project's own 'deltalog' data source",
            file=sys.stderr,
        )


def spark_submit_args() -> list[str]:
    """``spark-submit`` arguments that give a job Delta on Spark (``--jars`` and the ``--conf`` of
    the extension, catalog and ``spark.lakemq.delta``); empty when the jars cannot be had."""
    jars = delta_jars()
    if jars is None:
        return ["--conf", "spark.lakemq.delta=false"]
    return [
        "--jars",
        jars.spark_jars,
        "--conf",
        f"spark.sql.extensions={DELTA_EXTENSION}",
        "--conf",
        f"spark.sql.catalog.spark_catalog={DELTA_CATALOG}",
        "--conf",
        "spark.lakemq.delta=true",
    ]
