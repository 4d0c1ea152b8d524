"""The engine's one configuration object.

Precedence: explicit argument > ``MQ_*`` environment variable > ``conf/engine.toml`` > default.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from engine.errors import ConfigError
from engine.protocol.shards import MAX_SHARDS

PROJECT_ROOT = Path(__file__).resolve().parent.parent
# The defaults ship inside the package (engine/conf, package data; the repository's conf/ links to
# it), so an installed wheel finds them from any directory.
PACKAGE_CONF_DIR = Path(__file__).resolve().parent / "conf"
# RocketMQ's flushDiskType: ASYNC_FLUSH acknowledges a send once its commit is in the file system;
# SYNC_FLUSH only once its data file, commit file and their directories are fsynced.
ASYNC_FLUSH = "ASYNC_FLUSH"
SYNC_FLUSH = "SYNC_FLUSH"
FLUSH_DISK_TYPES = (ASYNC_FLUSH, SYNC_FLUSH)
# Spark's (log4j's) levels, as ``SparkContext.setLogLevel`` accepts them.
LOG_LEVELS = ("ALL", "DEBUG", "INFO", "WARN", "ERROR", "FATAL", "OFF", "TRACE")
# Storage options (delta-rs / object_store keys such as AWS_ENDPOINT_URL) also come from the
# environment: MQ_STORAGE_<KEY>=value sets <KEY>, and the AWS_* variables delta-rs itself reads are
# collected too, so that Spark executors and spawned jobs get the same options as this process.
STORAGE_ENV_PREFIX = "MQ_STORAGE_"
# The AWS_* variables that name an S3 endpoint and identity (delta-rs reads these itself; they are
# collected so Spark's s3a and spawned jobs get them too). Others (AWS_CA_BUNDLE, AWS_PROFILE …) stay
# with the process.
_AWS_ENV_KEYS = (
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ALLOW_HTTP",
    "AWS_VIRTUAL_HOSTED_STYLE_REQUEST",
    "AWS_S3_ALLOW_UNSAFE_RENAME",
)
# Words that mark a storage option's value as a secret: never printed, logged or put on a command line.
_SECRET_WORDS = ("SECRET", "TOKEN", "PASSWORD", "CREDENTIAL", "SAS", "ACCOUNT_KEY", "ACCESS_KEY")


def is_secret_option(key: str) -> bool:
    """Whether a storage option's value is a secret (``AWS_SECRET_ACCESS_KEY``, session tokens,
    Azure account keys …): shown as ``***`` wherever options are printed."""
    upper = key.upper()
    return upper.endswith("_KEY") or any(word in upper for word in _SECRET_WORDS)


def redact_storage(options: Mapping[str, str]) -> dict[str, str]:
    """``options`` with every secret value replaced by ``***`` (for messages, logs and status)."""
    return {k: ("***" if is_secret_option(k) else v) for k, v in options.items()}


@dataclass(frozen=True)
class EngineConfig:
    """Settings shared by clients and jobs (see ``conf/engine.toml`` for what each means)."""

    store: str = "./mqdata"
    default_queues: int = 4
    max_batch_bytes: int = 4 * 1024 * 1024
    max_commit_attempts: int = 64
    producer_linger_ms: int = 5
    producer_batch_size: int = 2048
    pull_batch_size: int = 32
    max_transfer_count: int = 32
    max_transfer_bytes: int = 256 * 1024
    long_poll_interval_ms: int = 20
    long_poll_max_ms: int = 20_000
    # The wire doors create a topic a client asks the route of (RocketMQ's autoCreateTopicEnable).
    auto_create_topics: bool = True
    # The RocketMQ door keeps the wire encoding of recently read messages, up to this many bytes, and
    # answers a pull it holds whole from memory (engine.remoting.recent); 0 turns it off.
    wire_recent_bytes: int = 256 * 1024**2
    dispatch_trigger_ms: int = 200
    checkpoint_dir: str = ""
    file_reserved_hours: int = 72
    # How long each table keeps its Delta log files (its history: time travel, stream readers) behind
    # its newest checkpoint: ``delta.logRetentionDuration``. One commit is one file, so this is what
    # bounds a busy table's _delta_log. Versions older than the data files vacuum keeps cannot be read
    # anyway; 7 days covers message retention (72 h) plus vacuum's window (24 h) with room to spare.
    log_retention_minutes: int = 7 * 24 * 60
    max_reconsume_times: int = 16
    # Where a new group starts with ConsumeFrom.LAST (engine.client.offsets.is_young): a queue still
    # holding offset 0 whose shard of the commit log took at most this many bytes since its first
    # message counts as "still in memory" and starts at 0, any other at its end. RocketMQ's broker
    # asks the same of its page cache: commit log written since <= accessMessageInMemoryMaxRatio
    # (40 %) of RAM, so 6.4 GiB on a 16 GiB broker; 4 GiB here, fixed rather than read from the
    # machine so every client and door of one store agrees. A size, not a clock: a week-old,
    # little-used queue is young, as on RocketMQ. 0 disables (QMQ: new groups start at the latest).
    # (It replaced in_memory_age_ms, a clock, which is gone: an engine.toml or an explicit argument
    # still naming it fails as an unknown key, whose message lists this one.)
    in_memory_max_bytes: int = 4 * 1024**3
    timer_max_delay_sec: int = 3 * 24 * 3600
    log_level: str = "WARN"
    flush_disk_type: str = ASYNC_FLUSH
    # Commit logs a store keeps (engine.protocol.shards), each with its own sequencer; fixed when the
    # store is created (a store records its count, and opening it with another count set here fails).
    commit_log_shards: int = 1
    # delta-rs storage options for an object-store root (``[storage]`` in engine.toml, MQ_STORAGE_<KEY>,
    # the AWS_* environment, ``--storage-option KEY=VALUE``): credentials and endpoint. Secret values
    # never appear in the config's repr.
    storage: Mapping[str, str] = field(default_factory=dict, compare=True, hash=False)

    def __post_init__(self) -> None:
        if not isinstance(self.storage, Mapping) or not all(
            isinstance(k, str) and k and isinstance(v, str) for k, v in self.storage.items()
        ):
            raise ConfigError(
                "config storage must be a table of option names to string values "
                f"(delta-rs storage options), got {type(self.storage).__name__}",
                key="storage",
            )
        object.__setattr__(self, "storage", dict(self.storage))
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type in ("int", int) and (not isinstance(value, int) or isinstance(value, bool)):
                raise ConfigError(f"config {f.name} must be an integer, got {value!r}", key=f.name)
            if f.type in ("bool", bool) and not isinstance(value, bool):
                raise ConfigError(f"config {f.name} must be true or false, got {value!r}", key=f.name)
            if f.type in ("str", str) and not isinstance(value, str):
                raise ConfigError(f"config {f.name} must be a string, got {value!r}", key=f.name)
        if self.log_level.upper() not in LOG_LEVELS:
            raise ConfigError(
                f"config log_level {self.log_level!r} must be one of {', '.join(LOG_LEVELS)}", key="log_level"
            )
        if self.flush_disk_type not in FLUSH_DISK_TYPES:
            raise ConfigError(
                f"config flush_disk_type {self.flush_disk_type!r} must be one of "
                f"{', '.join(FLUSH_DISK_TYPES)}",
                key="flush_disk_type",
            )
        positive = (
            "default_queues",
            "max_batch_bytes",
            "max_commit_attempts",
            "producer_batch_size",
            "pull_batch_size",
            "max_transfer_count",
            "max_transfer_bytes",
            "long_poll_interval_ms",
            "dispatch_trigger_ms",
            "timer_max_delay_sec",
            "log_retention_minutes",
            "commit_log_shards",
        )
        for name in positive:
            if getattr(self, name) <= 0:
                raise ConfigError(f"config {name} must be > 0, got {getattr(self, name)}", key=name)
        if (
            self.producer_linger_ms < 0
            or self.long_poll_max_ms < 0
            or self.file_reserved_hours < 0
            or self.in_memory_max_bytes < 0
            or self.wire_recent_bytes < 0
        ):
            raise ConfigError(
                "linger, long-poll, retention, in-memory-size and wire-recent-size settings must be >= 0"
            )
        if self.commit_log_shards > MAX_SHARDS:
            raise ConfigError(
                f"config commit_log_shards must be at most {MAX_SHARDS}, got {self.commit_log_shards}",
                key="commit_log_shards",
            )

    def __repr__(self) -> str:
        shown = ", ".join(
            f"{f.name}={redact_storage(self.storage) if f.name == 'storage' else getattr(self, f.name)!r}"
            for f in fields(self)
        )
        return f"EngineConfig({shown})"

    def replace(self, **changes: Any) -> EngineConfig:
        return dataclasses.replace(self, **changes)


def storage_from_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Storage options named by the environment: the S3 ``AWS_*`` variables, then ``MQ_STORAGE_<KEY>``
    (which wins), with empty values ignored."""
    env = os.environ if environ is None else environ
    found = {k: env[k] for k in _AWS_ENV_KEYS if env.get(k)}
    for key, value in env.items():
        name = key[len(STORAGE_ENV_PREFIX) :]
        if key.startswith(STORAGE_ENV_PREFIX) and name and value:
            found[name] = value
    return found


def parse_storage_option(text: str) -> tuple[str, str]:
    """One ``KEY=VALUE`` of ``--storage-option``.

    Raises:
        ConfigError: no ``=``, or an empty key.
    """
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(
            f"storage option must be KEY=VALUE (e.g. AWS_REGION=us-east-1), got {text.split('=')[0]!r}"
        )
    return key.strip(), value


STORAGE_OPTION_HELP = (
    "a delta-rs storage option KEY=VALUE for an object-store root (repeatable), e.g. "
    "AWS_ENDPOINT_URL=http://127.0.0.1:8333; also [storage] in engine.toml, MQ_STORAGE_<KEY>, AWS_*"
)


def export_storage_options(items: Sequence[str] | None) -> dict[str, str]:
    """Put ``--storage-option KEY=VALUE`` items into this process's environment as
    ``MQ_STORAGE_<KEY>``, where every store this process opens, the jobs it runs in-process and
    the programs it starts (spark-submit, job subprocesses) find them, without a secret ever
    appearing on a command line. Returns the options parsed.

    Raises:
        ConfigError: an item that is not ``KEY=VALUE``.
    """
    parsed = dict(parse_storage_option(item) for item in items or ())
    for key, value in parsed.items():
        os.environ[STORAGE_ENV_PREFIX + key] = value
    return parsed


def _coerce(name: str, raw: Any, kind: Any) -> Any:
    if kind in ("bool", bool) and isinstance(raw, str):
        if raw.strip().lower() in ("true", "1", "yes", "on"):
            return True
        if raw.strip().lower() in ("false", "0", "no", "off"):
            return False
        raise ConfigError(f"{name} must be true or false, got {raw!r}", key=name)
    if kind in ("int", int) and isinstance(raw, str):
        try:
            return int(raw)
        except ValueError as exc:
            raise ConfigError(f"{name} must be an integer, got {raw!r}", key=name) from exc
    return raw


def conf_dir() -> Path:
    """Where the settings files live: ``MQ_CONF_DIR`` if set, else the defaults shipped in the
    package (``engine/conf``, which the repository's ``conf/`` links to)."""
    env = os.environ.get("MQ_CONF_DIR")
    return Path(env) if env else PACKAGE_CONF_DIR


def config_file() -> Path:
    """The ``engine.toml`` in effect: the one in :func:`conf_dir`."""
    return conf_dir() / "engine.toml"


def load_config(path: str | Path | None = None, **overrides: Any) -> EngineConfig:
    """Load the configuration with its precedence rules and validate it.

    Args:
        path: an ``engine.toml`` to read instead of the default one.
        **overrides: explicit values; ``None`` values are ignored.

    Raises:
        ConfigError: an unknown key, a value of the wrong type, or an explicit ``path`` that is not
            a readable TOML file.
    """
    known = {f.name: f.type for f in fields(EngineConfig)}
    values: dict[str, Any] = {}
    storage: dict[str, str] = {}
    if path is not None and not isinstance(path, str | os.PathLike):
        raise ConfigError(f"config path must be a path to an engine.toml, got {path!r}")
    file = Path(path) if path else config_file()
    if path and not file.is_file():
        raise ConfigError(f"config file {file} does not exist (or is not a file)", path=str(file))
    if file.exists():
        try:
            data = tomllib.loads(file.read_text())
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{file} is not valid TOML: {exc}") from exc
        except OSError as exc:
            raise ConfigError(f"{file} cannot be read: {exc}", path=str(file)) from exc
        section = data.get("engine", data)
        if not isinstance(section, dict):
            raise ConfigError(f"{file}: [engine] must be a table of settings, got {section!r}")
        table = data.get("storage", {})
        if not isinstance(table, dict) or not all(isinstance(v, str) for v in table.values()):
            raise ConfigError(f"{file}: [storage] must be a table of option names to strings", key="storage")
        storage.update(table)
        for key, value in section.items():
            if key == "storage" and "engine" not in data:
                continue  # a file without [engine]: the [storage] table is read above
            if key not in known:
                raise ConfigError(f"{file}: unknown key {key!r}; known: {', '.join(sorted(known))}", key=key)
            values[key] = value
    for key, kind in known.items():
        env = os.environ.get(f"MQ_{key.upper()}")
        if key != "storage" and env is not None and env != "":
            values[key] = _coerce(key, env, kind)
    storage.update(storage_from_env())
    for key, value in overrides.items():
        if key not in known:
            raise ConfigError(f"unknown config key {key!r}", key=key)
        if key == "storage" and value is not None:
            if not isinstance(value, Mapping):
                raise ConfigError("storage must be a mapping of option names to strings", key="storage")
            storage.update(value)
        elif value is not None:
            values[key] = value
    values["storage"] = storage
    return EngineConfig(**values)
