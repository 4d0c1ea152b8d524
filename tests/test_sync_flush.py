"""SYNC_FLUSH: a send is acknowledged only after what its commit wrote is fsynced."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from engine import Admin, CommitStateUnknownError, ConfigError, Message, Producer, Store
from engine.config import ASYNC_FLUSH, SYNC_FLUSH, load_config
from engine.store import schemas
from engine.store.delta.durability import fsync_version, version_files


def _spy_fsync(monkeypatch: pytest.MonkeyPatch, events: list[str]) -> None:
    """Record the path behind every fd passed to os.fsync (by /proc/self/fd), then really fsync."""
    real = os.fsync

    def spy(fd: int) -> None:
        events.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", spy)


def _open(tmp_path: Path, flush: str) -> Store:
    store = Store.open(tmp_path / "mqdata", config=load_config(flush_disk_type=flush))
    Admin(store).create_topic("T", 2)
    return store


def test_sync_flush_fsyncs_the_data_file_the_commit_file_and_their_directories_before_the_send_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _open(tmp_path, SYNC_FLUSH)
    events: list[str] = []
    _spy_fsync(monkeypatch, events)
    with Producer(store) as producer:
        producer.send(Message("T", b"durable"), queue_id=1)
        events.append("<acknowledged>")
    table = store.uri(schemas.COMMIT_LOG)
    data, log_file = version_files(table, store.version(schemas.COMMIT_LOG))
    assert len(data) == 1 and os.path.exists(data[0])
    acked = events.index("<acknowledged>")
    flushed = events[:acked]
    assert set(flushed) == {*data, log_file, table, os.path.join(table, "_delta_log")}
    # files before the directories that name them
    assert flushed.index(data[0]) < flushed.index(table)
    assert flushed.index(log_file) < flushed.index(os.path.join(table, "_delta_log"))


def test_async_flush_acknowledges_without_fsync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = _open(tmp_path, ASYNC_FLUSH)
    events: list[str] = []
    _spy_fsync(monkeypatch, events)
    with Producer(store) as producer:
        producer.send(Message("T", b"fast"), queue_id=0)
    assert not [e for e in events if schemas.COMMIT_LOG in e]


def test_every_batch_of_an_async_producer_is_flushed_under_sync_flush(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _open(tmp_path, SYNC_FLUSH)
    events: list[str] = []
    _spy_fsync(monkeypatch, events)
    first = store.version(schemas.COMMIT_LOG) + 1
    with Producer(store) as producer:
        futures = [producer.send_async(Message("T", b"%d" % i)) for i in range(20)]
        assert len([f.result() for f in futures]) == 20
    table = store.uri(schemas.COMMIT_LOG)
    for version in range(first, store.version(schemas.COMMIT_LOG) + 1):
        data, log_file = version_files(table, version)
        assert data and {*data, log_file} <= set(events)


def test_a_failed_flush_is_not_acknowledged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = _open(tmp_path, SYNC_FLUSH)

    def broken(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", broken)
    with Producer(store) as producer, pytest.raises(CommitStateUnknownError, match="could not be flushed"):
        producer.send(Message("T", b"lost?"), queue_id=0)


def test_fsync_version_of_a_missing_commit_is_a_typed_error(tmp_path: Path) -> None:
    store = _open(tmp_path, ASYNC_FLUSH)
    with pytest.raises(CommitStateUnknownError):
        fsync_version(store.uri(schemas.COMMIT_LOG), 99)


def test_flush_disk_type_is_read_from_the_environment_and_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MQ_FLUSH_DISK_TYPE", SYNC_FLUSH)
    assert load_config().flush_disk_type == SYNC_FLUSH
    with pytest.raises(ConfigError, match="flush_disk_type"):
        load_config(flush_disk_type="SOMETIMES")


_TRACED_SEND = """
import os, sys
from engine import Admin, Message, Producer, Store
from engine.config import load_config
store = Store.open(sys.argv[1], config=load_config(flush_disk_type=sys.argv[2]))
Admin(store).create_topic("T", 1)
with Producer(store) as producer:
    producer.send(Message("T", b"traced"))
    os.write(1, b"ACKNOWLEDGED\\n")
"""


def _traced_fsyncs(tmp_path: Path, flush: str) -> tuple[list[str], int, Store]:
    """Run one send in a child process under strace; the paths it fsynced (in order, read from the
    openat that gave each fd) up to the moment it printed its acknowledgement, and how many fsyncs
    of commit-log paths followed it."""
    strace = shutil.which("strace")
    if strace is None:
        pytest.skip("strace is not installed (.ci/run installs it)")
    root, trace = tmp_path / "mqdata", tmp_path / "trace"
    script = tmp_path / "send.py"
    script.write_text(_TRACED_SEND)
    run = subprocess.run(
        [
            strace,
            "-f",
            "-qq",
            "-e",
            "trace=openat,fsync,write",
            "-o",
            str(trace),
            sys.executable,
            str(script),
            str(root),
            flush,
        ],
        capture_output=True,
        timeout=300,
        check=False,
    )
    if run.returncode != 0 and b"ptrace" in run.stderr:
        pytest.skip(f"strace cannot trace here: {run.stderr[-200:]!r}")
    assert run.returncode == 0, run.stderr[-2000:]
    opened: dict[str, str] = {}
    before: list[str] = []
    after = 0
    acknowledged = False
    for line in trace.read_text().splitlines():
        pid = line.split(" ", 1)[0]
        if "openat(" in line and "= " in line and '"' in line:
            fd = line.rsplit("= ", 1)[1].split(" ")[0]
            opened[f"{pid}:{fd}"] = line.split('"')[1]
        elif "fsync(" in line:
            fd = line.split("fsync(", 1)[1].split(")")[0]
            path = opened.get(f"{pid}:{fd}", "?")
            if acknowledged:
                after += schemas.COMMIT_LOG in path
            else:
                before.append(path)
        elif "ACKNOWLEDGED" in line:
            acknowledged = True
    assert acknowledged
    return before, after, Store.open(root)


def test_under_strace_sync_flush_fsyncs_what_the_send_wrote_before_it_is_acknowledged(tmp_path: Path) -> None:
    flushed, late, store = _traced_fsyncs(tmp_path, SYNC_FLUSH)
    table = store.uri(schemas.COMMIT_LOG)
    version = store.version(schemas.COMMIT_LOG)
    data, log_file = version_files(table, version)
    expected = {*data, log_file, table, os.path.join(table, "_delta_log")}
    assert expected <= set(flushed) and late == 0
    assert [p for p in flushed if schemas.COMMIT_LOG in p] == [
        *data,
        log_file,
        table,
        os.path.join(table, "_delta_log"),
    ]


def test_under_strace_async_flush_fsyncs_nothing_of_the_commit_log(tmp_path: Path) -> None:
    flushed, late, store = _traced_fsyncs(tmp_path, ASYNC_FLUSH)
    assert [p for p in flushed if p.startswith(store.uri(schemas.COMMIT_LOG))] == [] and late == 0
