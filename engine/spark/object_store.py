"""Spark on an object-store store: the S3A jars, the Hadoop settings, and who reads and who writes.

The split, which every job, view and data source keeps:

* Spark (the JVM: Delta's scans and streams, the checkpoint when it is on the store) only ever
  READS the store's tables, through Hadoop's S3A file system configured here from the store's
  storage options (``fs.s3a.*`` on the session's Hadoop configuration). ``s3://`` is mapped to S3A
  too. A ``spark.hadoop.fs.s3a.*`` setting the user gave Spark (``--conf``, ``spark-defaults.conf``)
  wins over the one derived from the storage options, so Spark may hold a read-only identity.
* Python (delta-rs, on the driver and in the Python workers of the ``deltalog`` and ``mq`` sources)
  reads AND writes with the storage options themselves (``Store.storage_options``): every commit of
  every job goes through the engine in Python, never through Spark.

The jars (``hadoop-aws`` of the Hadoop version pyspark bundles, and the AWS SDK v2 ``bundle`` its
pom names) are fetched on first use into the jar cache, as the Delta jars are
(:mod:`engine.spark.delta_jars`), and only for a store on S3. Credentials are always static keys
(``SimpleAWSCredentialsProvider``, or ``TemporaryAWSCredentialsProvider`` with a session token):
never the instance-metadata endpoint. They are set on the Hadoop configuration at run time, never in
the Spark conf (which the UI's environment page and event logs show), and never printed.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from engine.errors import ConfigError
from engine.spark.delta_jars import DeltaJars, cached_jars, fetch_jars
from engine.spark.delta_jars import spark_submit_args as delta_submit_args

# Schemes Spark reads through S3A (delta-rs takes both too).
S3_SCHEMES = ("s3", "s3a")
S3A_FILESYSTEM = "org.apache.hadoop.fs.s3a.S3AFileSystem"
_S3A_ABSTRACT = "org.apache.hadoop.fs.s3a.S3A"
_SIMPLE_PROVIDER = "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
_TEMPORARY_PROVIDER = "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
_HADOOP_JAR = re.compile(r"^hadoop-client-api-(\d+\.\d+\.\d+)\.jar$")
_TRUE = ("1", "true", "yes", "on")
# Coordinates whose fetch failed in this process: not tried again for every session.
_failed: set[str] = set()

# delta-rs (object_store) option names, upper-cased, for each Hadoop setting they give.
_ALIASES: dict[str, tuple[str, ...]] = {
    "endpoint": ("AWS_ENDPOINT_URL", "AWS_ENDPOINT", "ENDPOINT_URL", "ENDPOINT"),
    "access": ("AWS_ACCESS_KEY_ID", "ACCESS_KEY_ID"),
    "secret": ("AWS_SECRET_ACCESS_KEY", "SECRET_ACCESS_KEY"),
    "token": ("AWS_SESSION_TOKEN", "AWS_TOKEN", "SESSION_TOKEN", "TOKEN"),
    "region": ("AWS_REGION", "AWS_DEFAULT_REGION", "REGION", "DEFAULT_REGION"),
    "virtual": ("AWS_VIRTUAL_HOSTED_STYLE_REQUEST", "VIRTUAL_HOSTED_STYLE_REQUEST"),
    "http": ("AWS_ALLOW_HTTP", "ALLOW_HTTP"),
}


def scheme_of(root: str) -> str | None:
    """The URI scheme of a store root (``s3a``), or None for a local path (``file://`` included)."""
    if "://" not in root or root.startswith("file://"):
        return None
    return root.split("://", 1)[0].lower()


def is_s3(root: str) -> bool:
    """Whether ``root`` is on S3 (``s3://`` or ``s3a://``): the roots Spark reads through S3A."""
    return scheme_of(root) in S3_SCHEMES


def hadoop_version() -> str:
    """The Hadoop version pyspark bundles (from its ``hadoop-client-api-<version>.jar``).

    Raises:
        ConfigError: pyspark's jars hold no Hadoop client.
    """
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    for jar in sorted(jars.glob("hadoop-client-api-*.jar")):
        match = _HADOOP_JAR.match(jar.name)
        if match:
            return match.group(1)
    raise ConfigError(f"no hadoop-client-api jar in {jars}: cannot pick hadoop-aws", key="hadoop-aws")


def hadoop_aws_coordinate(version: str | None = None) -> str:
    """The Maven coordinate of ``hadoop-aws`` matching pyspark's Hadoop (its pom brings the AWS SDK
    v2 ``bundle`` of the version it was built with)."""
    return f"org.apache.hadoop:hadoop-aws:{version or hadoop_version()}"


def object_store_jars(root: str) -> DeltaJars | None:
    """The jars Spark needs to read ``root`` (``hadoop-aws`` and the AWS SDK bundle for S3), fetched
    on first use and cached; None for a root that needs none (local) or when they cannot be had
    (then one line on stderr says why, once per process, and Spark reads the store through
    ``deltalog``)."""
    if not is_s3(root):
        return None
    coordinate = "hadoop-aws"
    try:
        coordinate = hadoop_aws_coordinate()
        found = cached_jars(coordinate)
        if found is not None or coordinate in _failed:
            return found
        print(
            f"lakemq: fetching the S3A jars ({coordinate} and the AWS SDK bundle, ~700 MB; "
            "first use only) ...",
            file=sys.stderr,
        )
        return fetch_jars(coordinate)
    except ConfigError as exc:
        _failed.add(coordinate)
        print(
            f"lakemq: Spark cannot read s3a:// natively ({exc}); it reads the store through the "
            "project's own 'deltalog' data source",
            file=sys.stderr,
        )
        return None


def _option(options: Mapping[str, str], what: str) -> str | None:
    upper = {k.upper(): v for k, v in options.items()}
    for name in _ALIASES[what]:
        value = upper.get(name)
        if value:
            return value
    return None


def s3a_settings(storage_options: Mapping[str, str] | None) -> dict[str, str]:
    """Hadoop settings (``fs.s3a.*``, without the ``spark.hadoop.`` prefix) that make S3A reach what
    the delta-rs ``storage_options`` reach: endpoint, region, path-style unless virtual-hosted style
    was asked, static keys (a session token switches to temporary credentials), plain HTTP where
    allowed, and ``s3://`` served by S3A too.

    Returns:
        The settings; secret values included (set them on a Hadoop configuration, never print them).
    """
    options = storage_options or {}
    out = {
        "fs.s3.impl": S3A_FILESYSTEM,
        "fs.AbstractFileSystem.s3.impl": _S3A_ABSTRACT,  # FileContext: streaming checkpoints on s3://
        "fs.s3a.impl": S3A_FILESYSTEM,
        "fs.AbstractFileSystem.s3a.impl": _S3A_ABSTRACT,
    }
    endpoint = _option(options, "endpoint")
    if endpoint:
        out["fs.s3a.endpoint"] = endpoint
        if endpoint.lower().startswith("http://"):
            out["fs.s3a.connection.ssl.enabled"] = "false"
    elif str(_option(options, "http") or "").lower() in _TRUE:
        out["fs.s3a.connection.ssl.enabled"] = "false"
    region = _option(options, "region")
    if region:
        out["fs.s3a.endpoint.region"] = region
    virtual = str(_option(options, "virtual") or "").lower() in _TRUE
    out["fs.s3a.path.style.access"] = "false" if virtual else "true"
    access, secret, token = _option(options, "access"), _option(options, "secret"), _option(options, "token")
    if access and secret:
        out["fs.s3a.access.key"] = access
        out["fs.s3a.secret.key"] = secret
    if token:
        out["fs.s3a.session.token"] = token
    out["fs.s3a.aws.credentials.provider"] = _TEMPORARY_PROVIDER if token else _SIMPLE_PROVIDER
    return out


def _loadable(spark: Any, name: str) -> bool:
    try:
        jvm = spark.sparkContext._jvm
        jvm.org.apache.spark.util.Utils.classForName(name, True, False)
    except Exception:  # py4j: the class is not on the session's classpath
        return False
    return True


# (application id, root, options) already configured: the settings are set once per session.
_configured: dict[tuple[str, str, tuple[tuple[str, str], ...]], bool] = {}


def prepare_session(spark: Any, root: str, storage_options: Mapping[str, str] | None) -> bool:
    """Make ``spark`` able to read the store at ``root`` natively, and say whether it can.

    A local root needs nothing (True). An ``s3://`` / ``s3a://`` root gets :func:`s3a_settings` on
    the session's Hadoop configuration, except the settings the Spark conf already gives
    (``spark.hadoop.<key>``: a user's choice, such as a read-only identity for Spark, wins); True
    when S3A is on the session's classpath. Any other scheme: False (Spark reads it through
    ``deltalog``, whose Python side takes delta-rs's options).
    """
    scheme = scheme_of(root)
    if scheme is None:
        return True
    if scheme not in S3_SCHEMES:
        return False
    key = (str(spark.sparkContext.applicationId), root, tuple(sorted((storage_options or {}).items())))
    done = _configured.get(key)
    if done is not None:
        return done
    ready = _loadable(spark, S3A_FILESYSTEM)
    if ready:
        conf = spark.sparkContext.getConf()
        hadoop = spark.sparkContext._jsc.hadoopConfiguration()
        for name, value in s3a_settings(storage_options).items():
            if not conf.contains(f"spark.hadoop.{name}"):
                hadoop.set(name, value)
    _configured[key] = ready
    return ready


def default_checkpoint_root(store_id: str) -> Path:
    """Where the jobs of an object-store store keep their checkpoints unless told: a local directory,
    ``$XDG_CACHE_HOME/lakemq/checkpoints/<store id>`` (``~/.cache/...``).

    Local is enough: a job's checkpoint holds only its source's offsets, and every job resumes from
    its own exactly-once marker in the tables it writes, so a lost or fresh checkpoint loses and
    repeats nothing (:func:`engine.spark.jobs.streams.run_log_job`).
    """
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "lakemq" / "checkpoints" / store_id


def store_root_of(argv: Sequence[str]) -> str:
    """The store a job's command line names: its ``--store`` (the last one), else ``MQ_STORE``, else
    the config's (``engine.toml``, ``./mqdata``)."""
    found: str | None = None
    args = list(argv)
    for i, arg in enumerate(args):
        if arg == "--store" and i + 1 < len(args):
            found = args[i + 1]
        elif arg.startswith("--store="):
            found = arg.split("=", 1)[1]
    if found:
        return found
    from engine.config import load_config

    return os.environ.get("MQ_STORE") or load_config().store


def spark_submit_args(argv: Sequence[str]) -> list[str]:
    """``spark-submit`` arguments for a job run with ``argv``: Delta on Spark
    (:func:`engine.spark.delta_jars.spark_submit_args`) and, when the store it names is on S3, the
    S3A jars in the same ``--jars`` (spark-submit keeps only one)."""
    args = delta_submit_args()
    s3a = object_store_jars(store_root_of(argv))
    if s3a is None:
        return args
    if "--jars" in args:
        at = args.index("--jars") + 1
        args[at] = f"{args[at]},{s3a.spark_jars}"
        return args
    return ["--jars", s3a.spark_jars, *args]


def print_spark_submit_args(argv: Sequence[str] | None = None) -> None:
    """Print :func:`spark_submit_args` for ``argv`` (default ``sys.argv[1:]``), one per line
    (``spark-submit.sh`` reads them)."""
    print("\n".join(spark_submit_args(sys.argv[1:] if argv is None else argv)))
