"""What the benchmark ran on: the machine and the versions of everything measured."""

from __future__ import annotations

import os
import platform
import subprocess
import time
from importlib import metadata
from typing import Any

from bench.peers import redis_server_version


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _ram_gib() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return None


def load_average() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def settle_disk() -> float:
    """Write back what earlier steps left dirty in the page cache (``sync``) before a system is
    measured, and return the seconds it took: on the bench machine, with dirty pages waiting, making
    a file cost 190-800 us of CPU, and 29 us right after a ``sync``, so a system measured right
    after another one's 100 MB could pay for them. Both systems of a comparison are settled so."""
    began = time.monotonic()
    os.sync()
    return time.monotonic() - began


def machine() -> dict[str, Any]:
    return {
        "cpu_model": _cpu_model(),
        "cores": os.cpu_count(),
        "ram_gib": _ram_gib(),
        "platform": platform.platform(),
        "load_average_start": load_average(),
    }


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def _java() -> str:
    try:
        out = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "not available"
    first = (out.stderr or out.stdout).strip().splitlines()
    return first[0] if first else "unknown"


def versions(redis_server: str | None) -> dict[str, str]:
    return {
        "python": platform.python_version(),
        "lakemq": _version("lakemq"),
        "deltalake": _version("deltalake"),
        "pyarrow": _version("pyarrow"),
        "pyspark": _version("pyspark"),
        "java": _java(),
        "redis-server": redis_server_version(redis_server),
        "redis-py": _version("redis"),
    }
