"""Offsets are assigned once even after a log cleanup deleted the commits that carried the marks."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine import Admin, Message, Producer, PullConsumer, Store
from engine.broker.dispatch import dispatch_pending
from engine.broker.maintenance import checkpoint, retain
from engine.config import load_config
from engine.errors import StoreError
from engine.store import schemas
from engine.store.commit_log import hwm as commit_log_marks
from engine.store.commit_log import saved_marks as marks_snapshots
from engine.store.commit_log.marks import HighWaterMarks

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = {"log_retention_minutes": 1, "file_reserved_hours": 0}


def _age_log(store: Store, seconds: float) -> None:
    aged = time.time() - seconds
    for path in (Path(store.uri(schemas.COMMIT_LOG)) / "_delta_log").iterdir():
        os.utime(path, (aged, aged))


def _send_from_a_new_process(store: Store, topic: str, queue_id: int) -> tuple[int, int]:
    code = (
        "import sys; from engine import Message, Producer, Store; from engine.config import load_config\n"
        f"store = Store.open(sys.argv[1], config=load_config(**{SETTINGS!r}))\n"
        "with Producer(store) as p:\n"
        f"    r = p.send_batch([Message({topic!r}, b'after')], queue_id={queue_id})[0]\n"
        "print(r.queue_offset, r.physical_offset)"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", code, store.root], capture_output=True, text=True, env=env, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr[-3000:]
    queue_offset, physical_offset = map(int, out.stdout.split())
    return queue_offset, physical_offset


@pytest.mark.slow
def test_a_consumed_queue_continues_after_retention_and_a_log_cleanup(tmp_path: Path):
    # Many queues, so that the commits left after the cleanup cannot name them all; the queue's
    # messages all consumed and deleted by retention, so that the rows cannot tell its offset either.
    store = Store.open(str(tmp_path / "s"), config=load_config(**SETTINGS))
    admin = Admin(store)
    admin.create_topic("T", 1)
    admin.create_topic("U", 4)
    admin.create_topics([f"Z{i}" for i in range(40)], 64)
    with Producer(store) as producer:
        for i in range(40):
            producer.send_batch([Message(f"Z{i}", b"z")], queue_id=63)
        for i in range(30):
            producer.send_batch([Message("T", f"t{i}".encode())], queue_id=0)
    dispatch_pending(store)
    consumer = PullConsumer(store, "g")
    consumer.commit_offset("T", 0, consumer.pull("T", 0, 0, max_nums=32).next_begin_offset)
    assert retain(store)["rows_removed"] == 30
    with Producer(store) as producer:
        for i in range(300):
            producer.send(Message("U", f"u{i}".encode()))
    last_physical = max(store.read(schemas.COMMIT_LOG).column("physical_offset").to_pylist())
    _age_log(store, 3600)
    checkpoint(store, schemas.COMMIT_LOG)
    assert len(list((Path(store.uri(schemas.COMMIT_LOG)) / "_delta_log").glob("*.json"))) == 1

    queue_offset, physical_offset = _send_from_a_new_process(store, "T", 0)
    assert queue_offset == 30  # not 0 again
    assert physical_offset > last_physical


def test_the_writers_own_checkpoint_saves_the_marks_first(store: Store, topic: str):
    with Producer(store) as producer:
        for i in range(100):
            producer.send(Message(topic, f"m{i}".encode()))
    assert store.version(schemas.COMMIT_LOG) == 100
    saved = marks_snapshots.load(store.uri(schemas.COMMIT_LOG), None, 100)
    assert saved is not None and saved[0] == 100
    expected = commit_log_marks.read_hwm(store.snapshot(schemas.COMMIT_LOG))
    assert saved[1].to_json() == expected.to_json()


def test_no_checkpoint_is_written_when_the_marks_cannot_be_saved(
    store: Store, topic: str, monkeypatch: pytest.MonkeyPatch
):
    def refuse(*args: object) -> None:
        raise StoreError("injected: disk full")

    monkeypatch.setattr(marks_snapshots, "save", refuse)
    with Producer(store) as producer:
        for i in range(100):
            producer.send(Message(topic, f"m{i}".encode()))
    log = Path(store.uri(schemas.COMMIT_LOG)) / "_delta_log"
    assert not list(log.glob("*.checkpoint.parquet"))
    with pytest.raises(StoreError, match="disk full"):
        checkpoint(store, schemas.COMMIT_LOG)
    assert not list(log.glob("*.checkpoint.parquet"))


def test_only_the_newest_saved_marks_are_kept_and_the_newest_at_or_before_is_loaded(tmp_path: Path):
    uri = str(tmp_path / "t")
    os.makedirs(uri)
    for version in (10, 20, 30, 40, 50):
        marks_snapshots.save(uri, None, version, HighWaterMarks(physical=version, queues={"T": [version]}))
    kept = sorted(p.name for p in (tmp_path / "t" / marks_snapshots.DIRECTORY).iterdir())
    assert kept == [f"{v:020d}.json" for v in (30, 40, 50)]
    found = marks_snapshots.load(uri, None, 45)
    assert found is not None and found[0] == 40 and found[1].next_queue_offset("T", 0) == 40
    assert marks_snapshots.load(uri, None, 29) is None
