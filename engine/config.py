"""The engine's one configuration object.

Precedence: explicit argument > ``MQ_*`` environment variable > ``conf/engine.toml`` > default.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from dataclasses import dataclass, fields
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

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type in ("int", int) and (not isinstance(value, int) or isinstance(value, bool)):
                raise ConfigError(f"config {f.name} must be an integer, got {value!r}", key=f.name)
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
        ):
            raise ConfigError("linger, long-poll, retention and in-memory-size settings must be >= 0")
        if self.commit_log_shards > MAX_SHARDS:
            raise ConfigError(
                f"config commit_log_shards must be at most {MAX_SHARDS}, got {self.commit_log_shards}",
                key="commit_log_shards",
            )

    def replace(self, **changes: Any) -> EngineConfig:
        return dataclasses.replace(self, **changes)


def _coerce(name: str, raw: Any, kind: Any) -> Any:
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
        for key, value in section.items():
            if key not in known:
                raise ConfigError(f"{file}: unknown key {key!r}; known: {', '.join(sorted(known))}", key=key)
            values[key] = value
    for key, kind in known.items():
        env = os.environ.get(f"MQ_{key.upper()}")
        if env is not None and env != "":
            values[key] = _coerce(key, env, kind)
    for key, value in overrides.items():
        if key not in known:
            raise ConfigError(f"unknown config key {key!r}", key=key)
        if value is not None:
            values[key] = value
    return EngineConfig(**values)
