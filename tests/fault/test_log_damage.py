"""What a crash leaves in a table directory: stray temporary files, uncommitted data files, a torn
last commit file in ``_delta_log``.

- Stray files (staging files of commits, temporary files of other writers, checksum files, parquet
  files written by a writer that died before committing) are ignored by readers, writers and
  maintenance: nothing reads a file the log does not name. Uncommitted parquet files here even hold
  copies of stored messages, so a reader that listed the directory would show duplicates.
- A torn last commit file (it does not parse) makes delta-rs refuse the whole table. Opening the
  store moves it to ``_delta_log/_quarantine/`` with a warning (its writer was never acknowledged)
  and the table works again: every acknowledged message readable, the next write takes the freed
  version, offsets dense. An earlier damaged commit is a :class:`StoreCorruptedError` naming the file.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from engine import (
    Producer,
    PullConsumer,
    PullStatus,
    SimpleConsumer,
    Store,
    StoreCorruptedError,
)
from engine.broker.dispatch import dispatch_pending
from engine.broker.maintenance import maintain
from engine.store import schemas
from engine.store.consume_queue import dispatched_version
from engine.store.delta.repair import QUARANTINE_DIR
from tests.fault.history import body_id, check, record
from tests.fault.scenario import TOPIC, timed
from tests.fault.scenario import Scenario as InProcessScenario
from tests.helpers import versions

pytestmark = pytest.mark.fault


class Scenario(InProcessScenario):
    """Sends of 48-byte bodies; the store reopened as a new process would, its log files at hand."""

    producer_group = "log-damage"
    body_size = 48

    def reopen(self) -> float:
        """Open the store afresh (the crashed process is gone); returns how long opening took."""
        self.producer.close()
        self.store, elapsed = timed(Store.open, self.root)
        self.producer = Producer(self.store, self.producer_group)
        return elapsed

    def commit_file(self, table: str, version: int) -> Path:
        return self.log_dir(table) / f"{version:020d}.json"

    def consume_all(self) -> None:
        with SimpleConsumer(self.store, "g-damage", "c1", ack_linger_ms=0) as consumer:
            consumer.subscribe(TOPIC)
            got = consumer.receive(32, 60_000)
            while got:
                ids = [body_id(m.body) for m in got]
                self.log.received(ids)
                for m in got:
                    consumer.ack(m)
                self.log.acked(ids)
                got = consumer.receive(32, 60_000)


@pytest.fixture
def scenario(tmp_path: Path, history_dir: Path) -> Iterator[Scenario]:
    yield from Scenario.running(tmp_path / "mqdata", history_dir)


# ----------------------------------------------------------------------------- stray files
def plant_strays(s: Scenario, table: str) -> list[Path]:
    """Files a crashed or concurrent writer can leave next to a table's commits and data."""
    log = s.log_dir(table)
    following = s.store.version(table) + 1
    strays = {
        log / f".tmp-{uuid.uuid4().hex}": b"partial",
        log / f"{following:020d}.json.tmp": b'{"add":{"path":"x.parquet"',
        log / f"_commit_{uuid.uuid4()}.json.tmp": b'{"commitInfo":',
        # object_store's staging file, left when it cannot be removed after the link (chattr +a)
        log / f"{following - 1:020d}.json#1": s.commit_file(table, following - 1).read_bytes(),
        log / f".{following - 1:020d}.json.crc": b"\x00",
        # a parquet file cut short by the crash
        log.parent / f"part-00000-{uuid.uuid4()}-c000.snappy.parquet": b"PAR1\x15\x00\x15",
    }
    for path, data in strays.items():
        path.write_bytes(data)
    # A whole parquet file whose commit never happened, holding copies of stored rows.
    rows = s.store.read(table)
    copy = log.parent / f"part-00001-{uuid.uuid4()}-c000.snappy.parquet"
    pq.write_table(rows, copy)
    return [*strays, copy]


def test_stray_temporary_and_uncommitted_files_are_ignored_by_readers_writers_and_maintenance(
    scenario: Scenario,
) -> None:
    s = scenario
    s.send_and_dispatch(8)
    strays = [p for t in (schemas.COMMIT_LOG, schemas.CONSUME_QUEUE) for p in plant_strays(s, t)]
    before = versions(s.store)

    open_s = s.reopen()  # a new process opens the store with the strays in place
    assert versions(s.store) == before
    assert sorted(s.stored_ids()) == sorted(s.log.history.acknowledged)
    pulled = PullConsumer(s.store, "reader").pull(TOPIC, 0, 0, 32)
    assert pulled.status is PullStatus.FOUND and [m.queue_offset for m in pulled.messages] == [0, 1, 2, 3]

    following = s.send(0)
    assert following.queue_offset == 4
    s.send_each(5)
    assert dispatch_pending(s.store) == 6
    s.consume_all()
    figures = check(s.store, s.log.history, topics=[TOPIC], dispatched=True, consumed=True)
    # Maintenance with the strays in place: compaction touches only files the log names, and vacuum
    # leaves young untracked files alone (a live writer's commit in the making looks just like them).
    report = maintain(s.store, force=True, vacuum_retention_hours=24, min_files=2)
    assert sorted(s.stored_ids()) == sorted(s.log.history.acknowledged)
    assert s.send(1).queue_offset == 6
    assert [p for p in strays if p.exists()] == strays
    # Once older than the vacuum window, the untracked data files are garbage: vacuum deletes them.
    # The log's own temporary files are delta-rs's, outside any table's data (left alone).
    data_strays = [p for p in strays if p.parent.name != "_delta_log"]
    day_ago = time.time() - 25 * 3600
    for path in data_strays:
        os.utime(path, (day_ago, day_ago))
    again = maintain(s.store, vacuum_retention_hours=24)
    left = [p for p in strays if p.exists()]
    record(
        "stray temporary and uncommitted files in table directories",
        figures,
        stray_files=len(strays),
        strays_left_after_vacuum=len(left),
        open_s=round(open_s, 3),
        maintenance_errors=len(report.errors) + len(again.errors),
    )
    figures.assert_ok()
    assert report.errors == () and again.errors == ()
    assert not (s.log_dir(schemas.COMMIT_LOG) / QUARANTINE_DIR).exists()  # strays are not torn commits
    assert left == [p for p in strays if p not in data_strays]
    assert sum(again.vacuumed.values()) >= len(data_strays)
    assert sorted(s.stored_ids()) == sorted(s.log.history.acknowledged)


# ----------------------------------------------------------------------------- a torn last commit
def tear(path: Path, how: str = "cut") -> bytes:
    """Damage a commit file as a power loss can: cut in the middle of its last action, or its
    length written but its blocks never (zero-filled). Returns what it held."""
    data = path.read_bytes()
    if how == "cut":
        path.write_bytes(data[: len(data) - len(data.split(b"\n")[-1]) // 2])
    else:
        path.write_bytes(b"\x00" * len(data))
    return data


@pytest.mark.parametrize("how", ["cut", "zero-filled"])
def test_a_torn_last_commit_log_entry_is_quarantined_at_open_and_its_version_taken_by_the_next_write(
    scenario: Scenario, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    s = scenario.named(f"torn last commit_log entry ({how}, unacknowledged), quarantined at open")
    s.send_and_dispatch(6)
    torn_id = f"m{s.count}"
    unacknowledged = s.send(0, acknowledge=False)  # its commit file is torn by the crash below
    torn_version = s.store.version(schemas.COMMIT_LOG)
    torn_file = s.commit_file(schemas.COMMIT_LOG, torn_version)
    whole = tear(torn_file, how)
    with pytest.raises(DeltaError, match=r"(?i)json"):
        DeltaTable(s.store.uri(schemas.COMMIT_LOG))  # what delta-rs alone does with it

    with caplog.at_level(logging.WARNING, logger="engine.store.delta.repair"):
        open_s = s.reopen()
    began = time.monotonic()
    assert s.store.version(schemas.COMMIT_LOG) == torn_version - 1
    assert sorted(s.stored_ids()) == sorted(s.log.history.acknowledged)
    following = s.send(0)
    recovery_s = open_s + time.monotonic() - began
    s.send_and_dispatch(3)
    s.consume_all()

    quarantined = list((s.log_dir(schemas.COMMIT_LOG) / QUARANTINE_DIR).iterdir())
    s.check_and_record(
        dispatched=True,
        consumed=True,
        recovery_s=recovery_s,
        quarantined=len(quarantined),
        open_s=round(open_s, 3),
    )
    assert [p.name.split(".json")[0] for p in quarantined] == [torn_file.stem]
    assert len(quarantined[0].read_bytes()) <= len(whole)  # kept, not deleted
    assert any(torn_file.name in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)
    assert s.commit_file(schemas.COMMIT_LOG, torn_version).exists()  # the freed version, reused
    assert following.queue_offset == unacknowledged.queue_offset  # no gap where the torn one was
    assert torn_id not in s.stored_ids()


def test_a_torn_last_consume_queue_entry_is_quarantined_and_dispatch_redoes_it_exactly_once(
    scenario: Scenario,
) -> None:
    s = scenario.named("torn last consume_queue entry, quarantined and re-dispatched")
    s.send_and_dispatch(4)
    covered = dispatched_version(s.store)
    s.send_each(4)
    dispatch_pending(s.store)  # this dispatch commit is torn by the crash below
    tear(s.commit_file(schemas.CONSUME_QUEUE, s.store.version(schemas.CONSUME_QUEUE)))

    open_s = s.reopen()
    began = time.monotonic()
    assert dispatched_version(s.store) == covered
    assert dispatch_pending(s.store) == 4
    recovery_s = open_s + time.monotonic() - began
    assert dispatch_pending(s.store) == 0
    s.consume_all()
    s.check_and_record(dispatched=True, consumed=True, recovery_s=recovery_s, open_s=round(open_s, 3))


def test_an_empty_last_commit_file_reads_as_an_empty_commit_and_writes_continue(scenario: Scenario) -> None:
    s = scenario.named("empty last commit_log entry (zero-length file)")
    s.send_each(4)
    s.send(1, acknowledge=False)
    last = s.store.version(schemas.COMMIT_LOG)
    s.commit_file(schemas.COMMIT_LOG, last).write_bytes(b"")  # zero length after a crash (ext4)

    open_s = s.reopen()
    assert s.store.version(schemas.COMMIT_LOG) == last  # delta-rs reads it as a commit without actions
    following = s.send(1)
    assert following.queue_offset == 2  # the marks come from the last commit that has them
    dispatch_pending(s.store)
    s.consume_all()
    s.check_and_record(dispatched=True, consumed=True, open_s=round(open_s, 3))
    assert not (s.log_dir(schemas.COMMIT_LOG) / QUARANTINE_DIR).exists()


def test_a_checksum_file_past_the_last_commit_is_moved_aside_at_open(scenario: Scenario) -> None:
    s = scenario.named("checksum file past the last commit, moved aside at open")
    s.send(0)
    orphan = s.log_dir(schemas.COMMIT_LOG) / f"{s.store.version(schemas.COMMIT_LOG) + 1:020d}.crc"
    orphan.write_text('{"tableSizeBytes": 0}')
    with pytest.raises(DeltaError):
        DeltaTable(s.store.uri(schemas.COMMIT_LOG))
    s.reopen()
    s.send(0)
    s.check_and_record()
    assert not orphan.exists()
    assert [p.name.split(".crc")[0] for p in (orphan.parent / QUARANTINE_DIR).iterdir()] == [orphan.stem]


@pytest.mark.parametrize("commits_kept", [True, False], ids=["commits-kept", "commits-cleaned-up"])
def test_a_torn_newest_checkpoint_is_moved_aside_when_the_commits_it_summarizes_remain(
    scenario: Scenario, commits_kept: bool
) -> None:
    s = scenario.named("torn newest commit_log checkpoint, moved aside at open")
    s.send_each(4)
    DeltaTable(s.store.uri(schemas.COMMIT_LOG)).create_checkpoint()
    checkpoint = next(s.log_dir(schemas.COMMIT_LOG).glob("*.checkpoint.parquet"))
    s.send_each(2)
    data = checkpoint.read_bytes()
    checkpoint.write_bytes(data[: len(data) // 2])
    if not commits_kept:  # as log cleanup does once a checkpoint covers them
        for path in s.log_dir(schemas.COMMIT_LOG).glob("*.json"):
            if int(path.stem) <= int(checkpoint.name[:20]):
                path.unlink()
        s.producer.close()
        with pytest.raises(StoreCorruptedError) as caught:
            Store.open(s.root)
        assert checkpoint.name in str(caught.value) and checkpoint.exists()
        return

    open_s = s.reopen()
    s.send(0)
    dispatch_pending(s.store)
    s.consume_all()
    s.check_and_record(dispatched=True, consumed=True, open_s=round(open_s, 3))
    quarantined = sorted(p.name.split(".", 1)[0] for p in (checkpoint.parent / QUARANTINE_DIR).iterdir())
    assert quarantined == sorted([checkpoint.name[:20], "_last_checkpoint"])


# ----------------------------------------------------------------------------- earlier damage
@pytest.mark.parametrize("last_torn_too", [False, True], ids=["earlier-only", "earlier-and-last"])
def test_a_damaged_earlier_commit_is_a_typed_error_naming_the_file_and_nothing_is_moved(
    scenario: Scenario, last_torn_too: bool
) -> None:
    damage = "and a torn last one" if last_torn_too else "last intact"
    s = scenario.named(f"damaged earlier commit_log entry ({damage}): typed error, then restored from backup")
    s.send_each(4)
    damaged = [s.commit_file(schemas.COMMIT_LOG, 2)]
    if last_torn_too:
        damaged.append(s.commit_file(schemas.COMMIT_LOG, s.store.version(schemas.COMMIT_LOG)))
    backup = {path: tear(path) for path in damaged}
    listing = sorted(p.name for p in s.log_dir(schemas.COMMIT_LOG).iterdir())
    s.producer.close()

    with pytest.raises(StoreCorruptedError) as caught:
        Store.open(s.root)
    assert damaged[0].name in str(caught.value)
    assert caught.value.path == str(damaged[0])  # type: ignore[attr-defined]
    assert sorted(p.name for p in s.log_dir(schemas.COMMIT_LOG).iterdir()) == listing  # nothing moved

    for path, data in backup.items():  # the operator restores the files from a backup
        path.write_bytes(data)
    s.reopen()
    s.send(0)
    s.check_and_record(typed_error=type(caught.value).__name__, files_moved=0)
