"""What the benchmark ran on: the machine and the versions of everything measured."""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import statistics
import subprocess
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path
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
    """Write back what earlier steps left dirty in the page cache (``sync``) and, where the run may
    (as root), drop the clean page cache and the inode and dentry caches, before a system is
    measured; return the seconds it took.

    On the bench machine, with dirty pages waiting, making a file cost 190-800 us of CPU and 29 us
    right after a ``sync``; late in a full run it cost 780-940 us with nothing dirty (2026-11-30,
    the wire step; 23-30 us in a run of that step alone), and 60 us once the caches were dropped.
    A system measured then pays for the memory state the earlier steps left, more the more files it
    makes: both systems of a comparison are settled so, and what a file costs after it is read
    (:func:`file_create_us`)."""
    began = time.monotonic()
    os.sync()
    with contextlib.suppress(OSError), open("/proc/sys/vm/drop_caches", "w") as caches:
        caches.write("3\n")
    return time.monotonic() - began


FILE_PROBE_FILES = 200


def file_create_us(directory: Path, files: int = FILE_PROBE_FILES) -> float:
    """The CPU a new 1 KiB file costs in ``directory`` now (made, written, closed), in microseconds,
    a median over ``files`` of them (removed after).

    Not fixed on the bench machine (a Firecracker VM): 23-30 us in a run of the wire step alone,
    780-940 us late in a full run, 60 us once the caches were dropped (:func:`settle_disk`); the
    cause of the slow state was not found. A system that makes many small files (lakemq's commits)
    pays more for it than one that writes into a big mapped file (RocketMQ's commit log), so the run
    reads this before each system it measures.
    """
    probe = Path(tempfile.mkdtemp(prefix="create-probe-", dir=directory))
    data = b"x" * 1024
    costs = []
    try:
        for i in range(files):
            began = time.thread_time()
            fd = os.open(probe / f"f{i}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            os.write(fd, data)
            os.close(fd)
            costs.append(time.thread_time() - began)
    finally:
        shutil.rmtree(probe, ignore_errors=True)
    return round(statistics.median(costs) * 1e6, 1)


def _stat_fields(pid: int) -> list[str]:
    """The fields of ``/proc/<pid>/stat`` after the command name (raises OSError once it is gone)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def process_tree(pids: Iterable[int]) -> list[int]:
    """``pids`` and every live process descending from them."""
    children: dict[int, list[int]] = defaultdict(list)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                children[int(_stat_fields(int(entry))[1])].append(int(entry))
            except (OSError, IndexError, ValueError):
                continue
    out: list[int] = []
    todo = list(pids)
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


_TICKS_S = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids: Iterable[int]) -> float | None:
    """CPU time (user and system, every thread, and children already waited for) spent so far by
    the processes ``pids`` and their live descendants; None when one of ``pids`` is gone."""
    roots = list(pids)
    total = 0
    for pid in process_tree(roots):
        try:
            fields = _stat_fields(pid)
        except OSError:
            if pid in roots:
                return None
            continue  # a descendant that ended meanwhile: its time is its parent's once waited for
        # utime, stime, cutime, cstime: fields 14-17 of stat, 12-15 after the command name
        total += sum(int(v) for v in fields[11:15])
    return total / _TICKS_S


def machine_cpu_seconds() -> tuple[float, float]:
    """CPU time the whole machine has been busy so far, summed over its cores (user, nice, system,
    interrupts), and the time the hypervisor gave its cores to other machines (steal), in seconds."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq) / _TICKS_S, steal / _TICKS_S


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
