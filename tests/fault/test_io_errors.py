"""Writes failing with an I/O error: the error surfaces typed, nothing is acknowledged, the tables stay
readable and writes resume densely once the fault is gone.

The faults go through the real write path. The filesystem refuses the write: ``chattr +i`` makes a
directory immutable (even for root, which ignores permission bits), so delta-rs fails to create the
commit file in ``_delta_log`` (``EPERM`` on ``NNN.json#1``) or the parquet data file in the table
directory, while every existing file stays readable. ``chattr -i`` removes the fault. Where the
fault is "the commit landed but its answer was lost" (an object store timing out after the PUT),
the real ``write_deltalake`` runs and an ``OSError`` is raised after it.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import engine.store.delta.commits as commits
import engine.store.delta.direct_append as direct_append
from engine import (
    CommitStateUnknownError,
    ConsumeFrom,
    ConsumeResult,
    Message,
    MessageExt,
    PullConsumer,
    PullStatus,
    PushConsumer,
    SendResult,
    SimpleConsumer,
    Store,
    StoreError,
)
from engine.broker.dispatch import dispatch_pending
from engine.store import schemas
from engine.store.consume_queue import dispatched_version
from tests.fault.history import body_id, make_body
from tests.fault.scenario import QUEUES, TOPIC, timed
from tests.fault.scenario import Scenario as InProcessScenario
from tests.helpers import versions
from tests.raw_delta import raw_table

pytestmark = pytest.mark.fault


def _chattr(flag: str, path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["chattr", flag, str(path)], capture_output=True, text=True, check=False)


@pytest.fixture(scope="module")
def chattr_works(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The immutable flag needs chattr, CAP_LINUX_IMMUTABLE and a filesystem that has it (ext4, xfs)."""
    probe = tmp_path_factory.mktemp("chattr-probe")
    if shutil.which("chattr") is None or _chattr("+i", probe).returncode != 0:
        pytest.skip("cannot set the immutable flag here (needs chattr, root and ext4/xfs)")
    refused = False
    try:
        (probe / "f").touch()
    except PermissionError:
        refused = True
    finally:
        _chattr("-i", probe)
    if not refused:
        pytest.skip("the immutable flag does not refuse writes here")


@contextmanager
def refused_writes(directory: Path, flag: str = "i") -> Iterator[None]:
    """No file can be created, renamed or removed in ``directory`` while inside; reads still work.

    With ``flag="a"`` (append only) files can be created and linked but not removed or renamed.
    """
    done = _chattr(f"+{flag}", directory)
    assert done.returncode == 0, done.stderr
    try:
        yield
    finally:
        assert _chattr(f"-{flag}", directory).returncode == 0


class Scenario(InProcessScenario):
    """Sends of 64-byte bodies (single sends tagged ``A``), async sends, and their settling."""

    producer_group = "io-errors"
    body_size = 64
    tags = "A"

    def send_async(self, n: int) -> list[tuple[str, Future[SendResult]]]:
        ids = self.next_ids(n)
        self.log.sent(ids)
        return [(m, self.producer.send_async(Message(TOPIC, make_body(m, 64)), queue_id=1)) for m in ids]

    def settle(self, futures: list[tuple[str, Future[SendResult]]]) -> list[BaseException]:
        """Log the acknowledged async sends; return the errors of the others."""
        errors = []
        for mid, future in futures:
            error = future.exception(timeout=60)
            if error is None:
                self.log.acknowledged([mid])
            else:
                errors.append(error)
        return errors


@pytest.fixture
def scenario(tmp_path: Path, history_dir: Path) -> Iterator[Scenario]:
    yield from Scenario.running(tmp_path / "mqdata", history_dir)


@pytest.fixture
def object_store_scenario(
    tmp_path: Path, history_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Scenario]:
    """Producers committing through delta-rs, as they do on an object store (``MQ_DIRECT_APPEND=0``)."""
    monkeypatch.setenv(direct_append.DIRECT_ENV, "0")
    yield from Scenario.running(tmp_path / "mqdata", history_dir)


def _failures(call: Any, *args: Any) -> BaseException:
    with pytest.raises(StoreError) as caught:
        call(*args)
    return caught.value


# ----------------------------------------------------------------------------- commit-log writes
@pytest.mark.parametrize(
    "where",
    ["_delta_log", "data files"],
    ids=["commit-file-refused", "data-file-refused"],
)
def test_a_commit_log_write_refused_by_the_filesystem_surfaces_typed_and_acknowledges_nothing(
    chattr_works: None, scenario: Scenario, where: str
) -> None:
    s = scenario.named(f"commit-log write I/O error ({where} refused, EPERM)")
    s.send_each(6)
    s.send_batch(4, queue_id=1)
    dispatch_pending(s.store)
    before = versions(s.store)
    table_dir = Path(s.store.uri(schemas.COMMIT_LOG))
    target = table_dir / "_delta_log" if where == "_delta_log" else table_dir

    errors: list[BaseException] = []
    with refused_writes(target):
        errors.append(_failures(s.send, 0))
        errors.append(_failures(s.send_batch, 5, 1))
        errors += s.settle(s.send_async(3))
        # The store stays readable while writes fail: scans, pulls and dispatch (nothing new).
        readable = len(s.stored_ids())
        pulled = PullConsumer(s.store, "reader").pull(TOPIC, 0, 0, 32)
        assert dispatch_pending(s.store) == 0
        assert versions(s.store) == before

    assert len(errors) == 5
    assert all(type(e) is StoreError for e in errors), [repr(e) for e in errors]
    assert all("nothing was stored" in str(e) for e in errors), [str(e) for e in errors]
    assert readable == 10
    assert pulled.status is PullStatus.FOUND and len(pulled.messages) == 3

    first, recovery_s = timed(s.send, 0)
    assert first.queue_offset == 3  # queue 0 held 0..2: the failed sends left no gap
    after_batch = s.send_batch(3, queue_id=1)
    assert [r.queue_offset for r in after_batch] == [7, 8, 9]  # queue 1 held 0..6
    s.settle(s.send_async(2))
    dispatch_pending(s.store)

    failed = s.log.history.sent - s.log.history.acknowledged
    live = {Path(uri).name for uri in raw_table(s.store, schemas.COMMIT_LOG).file_uris()}
    orphans = [p.name for p in table_dir.glob("*.parquet") if p.name not in live]
    s.check_and_record(
        dispatched=True,
        recovery_s=recovery_s,
        failed_sends=len(failed),
        typed_errors=sum(type(e) is StoreError for e in errors),
        orphan_data_files=len(orphans),  # written before the refused commit; never read, kept by vacuum
    )
    assert failed and not failed & set(s.stored_ids())  # a failed send is in no commit


def _answers_lost_after_commits(monkeypatch: pytest.MonkeyPatch, errno: int, reason: str) -> list[int]:
    """Until ``monkeypatch.undo()``, every commit-log write is stored and then fails with
    ``OSError(errno, reason + " (after the commit was stored)")``: the answer lost on its way back.
    Returns a list that grows by one per lost answer."""
    real, real_link = commits.write_deltalake, direct_append.os.link
    lost: list[int] = []

    def commit_then_fail(*args: Any, **kwargs: Any) -> None:
        real(*args, **kwargs)
        lost.append(errno)
        raise OSError(errno, f"{reason} (after the commit was stored)")

    def link_then_fail(source: str, target: str, **kwargs: Any) -> None:  # a network file system's lost reply
        real_link(source, target, **kwargs)
        if target.endswith(".json"):
            lost.append(errno)
            raise OSError(errno, f"{reason} (after the commit was stored)")

    monkeypatch.setattr(commits, "write_deltalake", commit_then_fail)
    monkeypatch.setattr(direct_append.os, "link", link_then_fail)
    return lost


def test_a_commit_that_landed_but_whose_answer_was_lost_is_acknowledged_once(
    scenario: Scenario, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = scenario.named("commit landed, its answer lost (OSError after the write)")
    s.send(0)
    lost = _answers_lost_after_commits(monkeypatch, 104, "Connection reset by peer")
    landed = s.send(0)  # the writer finds its own batch in the log: acknowledged, not retried
    batch = s.send_batch(3, queue_id=0)
    monkeypatch.undo()
    s.send(0)

    assert len(lost) == 2
    assert landed.queue_offset == 1
    assert [r.queue_offset for r in batch] == [2, 3, 4]
    figures = s.check_and_record(lost_answers=len(lost))
    assert figures.stored == figures.acknowledged == 6


def test_a_commit_whose_outcome_cannot_be_read_back_is_unknown_and_the_next_send_continues_the_queue(
    object_store_scenario: Scenario, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = object_store_scenario.named("commit outcome unknown (write and read-back fail)")
    s.send(0)

    def unreadable(name: str, version: int | None = None) -> Any:
        raise OSError(110, "Connection timed out")

    _answers_lost_after_commits(monkeypatch, 110, "Connection timed out")
    monkeypatch.setattr(s.store, "snapshot", unreadable)
    [mid] = s.next_ids(1)
    s.log.sent([mid])
    with pytest.raises(CommitStateUnknownError, match="outcome cannot be read back"):
        s.producer.send(Message(TOPIC, make_body(mid, 64)), queue_id=0)
    monkeypatch.undo()

    nxt, recovery_s = timed(s.send, 0)
    s.send_batch(2, queue_id=0)
    dispatch_pending(s.store)

    assert mid in s.stored_ids()  # it did land (unknown to the producer, so not acknowledged)
    assert nxt.queue_offset == 2  # after the unknown commit's offset 1: no repeat, no gap
    s.check_and_record(dispatched=True, recovery_s=recovery_s, unknown_outcomes=1)


@pytest.mark.parametrize("unnamed", [True, False], ids=["unnamed-commit-files", "named-staging-files"])
def test_commits_in_a_log_whose_files_cannot_be_removed_are_acknowledged_and_leave_only_strays(
    chattr_works: None, scenario: Scenario, monkeypatch: pytest.MonkeyPatch, unnamed: bool
) -> None:
    """A direct append writes its commit file without a name and links it in (nothing to remove);
    where the file system has no unnamed files, under a staging name it then removes."""
    if not unnamed:
        monkeypatch.setattr(direct_append, "_unnamed_files", False)
    s = scenario.named(
        "commit files in an append-only _delta_log"
        + ("" if unnamed else " (named staging files: not removable)")
    )
    log_dir = s.log_dir(schemas.COMMIT_LOG)
    s.send(0)
    with refused_writes(log_dir, "a"):  # files can be made and linked in, not removed
        s.send_each(4)
        s.send_batch(3, queue_id=1)
    # delta-rs stages NNN.json#1, a direct append _commit_<uuid>.json.tmp
    strays = sorted(p.name for p in log_dir.iterdir() if "#" in p.name or p.name.endswith(".json.tmp"))
    reopened = Store.open(s.store.root)
    s.send(1)
    dispatch_pending(reopened)
    s.store = reopened  # checked as a new process sees it
    figures = s.check_and_record(dispatched=True, stray_files=len(strays))
    # a staging file per commit made under the fault, each ignored by every reader; none unnamed
    assert len(strays) == (0 if unnamed else 5)
    assert figures.stored == figures.acknowledged == 9


def test_opening_a_store_where_the_filesystem_refuses_writes_is_a_store_error(
    chattr_works: None, tmp_path: Path
) -> None:
    root = tmp_path / "refusing"
    root.mkdir()
    with refused_writes(root), pytest.raises(StoreError) as caught:
        Store.open(root)
    assert type(caught.value) is StoreError
    assert "cannot create table" in str(caught.value)
    assert list(root.iterdir()) == []
    assert Store.open(root).version(schemas.COMMIT_LOG) == 0  # once writable, it opens


# ----------------------------------------------------------------------------- dispatch
def test_a_dispatch_write_refused_leaves_the_consume_queue_as_it_was_and_resumes_exactly_once(
    chattr_works: None, scenario: Scenario
) -> None:
    s = scenario.named("dispatch write I/O error (consume_queue _delta_log refused)")
    s.send_and_dispatch(4)
    covered = dispatched_version(s.store)
    s.send_batch(5, queue_id=0)
    s.send(1)
    cq_log = s.log_dir(schemas.CONSUME_QUEUE)
    before = versions(s.store)
    with refused_writes(cq_log):
        with pytest.raises(StoreError, match="consume_queue"):  # the error names the table
            dispatch_pending(s.store)
        with pytest.raises(StoreError):
            dispatch_pending(s.store)  # a retry while the fault lasts fails the same way
        assert versions(s.store) == before
        during = PullConsumer(s.store, "reader").pull(TOPIC, 0, 0, 32)
    assert dispatched_version(s.store) == covered
    # readers plan the entries dispatch could not write from the commit log (the queue's tail)
    assert [m.queue_offset for m in during.messages] == list(range(7))

    added, recovery_s = timed(dispatch_pending, s.store)
    assert added == 6
    assert dispatch_pending(s.store) == 0
    fresh = PullConsumer(s.store, "reader").pull(TOPIC, 0, 0, 32)
    assert [m.queue_offset for m in fresh.messages] == list(range(7))
    s.check_and_record(dispatched=True, recovery_s=recovery_s, failed_dispatches=2)


# ----------------------------------------------------------------------------- consumer state
def test_a_consumer_offset_commit_refused_surfaces_typed_and_keeps_the_previous_offset(
    chattr_works: None, scenario: Scenario
) -> None:
    s = scenario.named("consumer-offset commit I/O error (consumer_offset refused)")
    for _ in range(5):
        s.send(0)
    dispatch_pending(s.store)
    consumer = PullConsumer(s.store, "g-offsets")
    first = consumer.pull(TOPIC, 0, 0, 2)
    consumer.commit_offset(TOPIC, 0, first.next_begin_offset)
    s.log.received([body_id(m.body) for m in first.messages])
    second = consumer.pull(TOPIC, 0, first.next_begin_offset, 32)
    s.log.received([body_id(m.body) for m in second.messages])
    before = versions(s.store)
    with refused_writes(s.log_dir(schemas.CONSUMER_OFFSET)):
        with pytest.raises(StoreError, match="consumer_offset"):  # the error names the table
            consumer.commit_offset(TOPIC, 0, second.next_begin_offset)
        assert consumer.committed_offset(TOPIC, 0) == 2
        assert versions(s.store) == before
    _, recovery_s = timed(consumer.commit_offset, TOPIC, 0, second.next_begin_offset)
    assert consumer.committed_offset(TOPIC, 0) == 5
    s.check_and_record(consumed=True, recovery_s=recovery_s, failed_commits=1)


def test_a_push_consumer_whose_offset_commits_fail_keeps_consuming_and_commits_once_writes_resume(
    chattr_works: None, scenario: Scenario
) -> None:
    s = scenario.named("push consumer offset commits I/O error (consumer_offset refused)")
    s.send_and_dispatch(6)
    seen: list[str] = []

    def listener(messages: list[MessageExt]) -> ConsumeResult:
        ids = [body_id(m.body) for m in messages]
        s.log.received(ids)
        seen.extend(ids)
        return ConsumeResult.SUCCESS

    consumer = PushConsumer(
        s.store, "g-push", consume_from=ConsumeFrom.FIRST, commit_interval_ms=50, pull_suspend_ms=50
    )
    consumer.subscribe(TOPIC)
    consumer.register_listener(listener)
    reader = PullConsumer(s.store, "g-push")

    def committed() -> list[int | None]:
        return [reader.committed_offset(TOPIC, q) for q in range(QUEUES)]

    consumer.start()
    wait_for(lambda: committed() == [3, 3])
    with refused_writes(s.log_dir(schemas.CONSUMER_OFFSET)):
        s.send_each(4)  # more messages while every offset commit fails
        dispatch_pending(s.store)
        wait_for(lambda: len(seen) >= 10)
        time.sleep(0.3)  # several commit intervals go by with the table refusing writes
        during = committed()
    _, recovery_s = timed(wait_for, lambda: committed() == [5, 5])
    consumer.shutdown()

    figures = s.check_and_record(consumed=True, recovery_s=recovery_s)
    assert during == [3, 3]  # consumption went on; its offsets could not be committed
    assert figures.redelivered == 0


def wait_for(condition: Callable[[], bool], timeout_s: float = 60.0) -> None:
    """Poll until ``condition`` holds (a bound against hanging, not a timing assertion)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def test_a_receive_whose_claim_cannot_be_written_claims_nothing_and_the_messages_stay_available(
    chattr_works: None, scenario: Scenario
) -> None:
    s = scenario.named("receive claim I/O error (action_log refused)")
    s.send_and_dispatch(6)
    with SimpleConsumer(s.store, "g-simple", "c1", ack_linger_ms=0) as consumer:
        consumer.subscribe(TOPIC)
        before = versions(s.store)
        with refused_writes(s.log_dir(schemas.ACTION_LOG)):
            with pytest.raises(StoreError):
                consumer.receive(16, 60_000)
            assert versions(s.store) == before
        got, recovery_s = timed(consumer.receive, 16, 60_000)
        while got:
            s.log.received([body_id(m.body) for m in got])
            for m in got:
                consumer.ack(m)
            s.log.acked([body_id(m.body) for m in got])
            got = consumer.receive(16, 60_000)
    figures = s.check_and_record(consumed=True, recovery_s=recovery_s, failed_receives=1)
    assert figures.received == 6 and figures.redelivered == 0
