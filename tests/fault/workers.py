"""Child processes of the fault scenarios: ``python -m tests.fault.workers <role> [options]``.

Roles:

- ``producer``: sends ``--count`` messages (fewer when stopped by SIGTERM) with ids ``<prefix>-<n>``
  (sync sends, or batches of ``--batch``); logs ``sent`` before a send and ``acknowledged``
  (fsynced) the moment it returns; a ``CommitConflictError`` is retried ``--conflict-retries``
  times, then logged as ``gave_up``.
- ``pull-consumer``: a ``PullConsumer`` of ``--group`` reading every queue from the group's committed
  offset; logs ``received`` for each batch, then commits the offset and logs ``acked``; ends after
  ``--idle-s`` without news (with ``--until-stopped``: only once SIGTERM asked it to). With
  ``--die-after-batches K`` it SIGKILLs itself after receiving its K-th batch, before committing.
- ``simple-consumer``: a ``SimpleConsumer``; logs ``received``, acks each message, logs ``acked``
  (acks are buffered and appended within ``ack_linger_ms``, or at ``close``). With
  ``--die-after-batches K`` it SIGKILLs itself after logging the K-th batch's receipt, before acking.
- ``dispatcher``: ``dispatch_pending`` in a loop (the Spark dispatch job's logic, without Spark).
- ``maintainer``: compaction (and checkpoints) in a loop.
- ``reader``: opens the store afresh, reads the commit log, pulls every queue of ``--topic`` and now
  and then runs ``mq topic stats``, in a loop while writers commit (object storage's listings while
  commits land); counts a table that moved backwards or forked (a row it read before changed or
  vanished), a torn read (a queue's offsets with a hole), a pulled message the commit log lacks, and
  every error by type, untyped ones apart.

With ``--survive-errors`` a producer outlives a store that fails (the object-store server killed,
503s): a typed error (``MQError``) is logged as ``gave_up`` with its type and counted, an untyped one
is counted apart with its text, and it goes on sending after ``--error-pause-ms``.

Each long-running role stops on SIGTERM or after ``--seconds``; every role prints one JSON line of
counters on stdout when it ends normally.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import threading
import time

# Handlers first: a stop requested while the heavy imports below still run must stop the loop, not
# kill the process with SIGTERM's default action.
_STOP_REQUESTED = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: _STOP_REQUESTED.set())
signal.signal(signal.SIGINT, lambda *_: _STOP_REQUESTED.set())

from collections import Counter  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from engine import (  # noqa: E402
    CommitConflictError,
    CommitStateUnknownError,
    Message,
    MQError,
    Producer,
    PullConsumer,
    PullStatus,
    SimpleConsumer,
    Store,
)
from engine.errors import InvalidReceiptHandleError  # noqa: E402
from tests.fault.history import HistoryLog, ReadCheck, body_id, make_body  # noqa: E402


def _die() -> None:
    """SIGKILL this process: no cleanup, no flush, no atexit."""
    os.kill(os.getpid(), signal.SIGKILL)


class _Stop:
    """SIGTERM / SIGINT or a time limit end a loop."""

    def __init__(self, seconds: float) -> None:
        self.event = _STOP_REQUESTED
        self.deadline = time.monotonic() + seconds

    def __bool__(self) -> bool:
        return self.event.is_set() or time.monotonic() >= self.deadline


def _out(**counters: Any) -> None:
    print(json.dumps(counters, default=str), flush=True)


# --------------------------------------------------------------------------- producer
def produce(args: argparse.Namespace) -> None:
    store = Store.open(args.store)
    log = HistoryLog(args.history, process=f"producer:{args.prefix}")
    ids = [f"{args.prefix}-{i}" for i in range(args.count)]
    step = max(1, args.batch)
    counts: Counter[str] = Counter()
    untyped: list[str] = []
    stop = _Stop(args.seconds)
    with Producer(store) as producer:
        for start in range(0, len(ids), step):
            if stop:
                break
            chunk = ids[start : start + step]
            messages = [Message(args.topic, make_body(mid, args.size), tags="F") for mid in chunk]
            log.sent(chunk)
            for attempt in range(args.conflict_retries + 1):
                try:
                    results = producer.send_batch(messages) if args.batch else [producer.send(messages[0])]
                except CommitConflictError:
                    counts["conflict_errors"] += 1
                    if attempt == args.conflict_retries:
                        log.gave_up(chunk, reason="CommitConflictError")
                        counts["gave_up"] += len(chunk)
                    continue
                except CommitStateUnknownError:
                    # Maybe stored, never acknowledged: not retried (a retry could store it twice).
                    log.gave_up(chunk, reason="CommitStateUnknownError")
                    counts["unknown"] += len(chunk)
                    break
                except MQError as exc:
                    if not args.survive_errors:
                        raise
                    # Failed (or, if the engine mislabels an unknown outcome, maybe stored): never
                    # retried under the same ids, so a retry cannot be what duplicates it.
                    log.gave_up(chunk, reason=type(exc).__name__)
                    counts[f"error:{type(exc).__name__}"] += 1
                    time.sleep(args.error_pause_ms / 1000)
                    break
                except Exception as exc:
                    if not args.survive_errors:
                        raise
                    log.gave_up(chunk, reason=f"untyped {type(exc).__name__}")
                    counts["untyped"] += 1
                    untyped.append(f"{type(exc).__name__}: {exc}"[:300])
                    time.sleep(args.error_pause_ms / 1000)
                    break
                log.acknowledged(
                    chunk, offsets=[[r.queue_id, r.queue_offset, r.physical_offset] for r in results]
                )
                counts["acknowledged"] += len(chunk)
                break
            if args.pause_ms:
                time.sleep(args.pause_ms / 1000)
    counts["sequencer_conflicts"] = producer.lost_races
    log.close()
    _out(**counts, untyped_errors=untyped[:5])


# --------------------------------------------------------------------------- consumers
def pull_consume(args: argparse.Namespace) -> None:
    store = Store.open(args.store)
    log = HistoryLog(args.history, process=f"pull:{args.consumer_id}")
    consumer = PullConsumer(store, args.group)
    queues = store.topic(args.topic).queues
    offsets = {q: consumer.committed_offset(args.topic, q) or 0 for q in range(queues)}
    statuses: Counter[str] = Counter()
    batches = 0
    stop = _Stop(args.seconds)
    idle_since = time.monotonic()
    errors: list[str] = []
    # With --until-stopped, idleness ends the run only after SIGTERM (then: drain, then stop).
    while time.monotonic() < stop.deadline and (args.until_stopped or not _STOP_REQUESTED.is_set()):
        found = False
        for q in range(queues):
            try:
                result = consumer.pull(args.topic, q, offsets[q], max_nums=args.max_nums)
            except Exception as exc:  # a pull must not fail: counted and reported, then go on
                errors.append(f"{type(exc).__name__}: {exc}"[:300])
                continue
            statuses[result.status.value] += 1
            if result.status is PullStatus.FOUND:
                ids = [body_id(m.body) for m in result.messages]
                log.received(ids, queue=q)
                batches += 1
                if batches == args.die_after_batches:
                    _die()
                time.sleep(args.work_ms / 1000)  # processing: a kill lands here often
                consumer.commit_offset(args.topic, q, result.next_begin_offset)
                log.acked(ids, queue=q)
                found = True
            offsets[q] = result.next_begin_offset
        if found:
            idle_since = time.monotonic()
        elif time.monotonic() - idle_since >= args.idle_s and (
            not args.until_stopped or _STOP_REQUESTED.is_set()
        ):
            break
        else:
            time.sleep(0.05)
    log.close()
    _out(batches=batches, statuses=dict(statuses), errors=errors)


def simple_consume(args: argparse.Namespace) -> None:
    store = Store.open(args.store)
    log = HistoryLog(args.history, process=f"simple:{args.consumer_id}")
    consumer = SimpleConsumer(
        store, args.group, consumer_id=args.consumer_id, invisible_ms_default=args.invisible_ms
    )
    consumer.subscribe(args.topic)
    batches = received = 0
    stop = _Stop(args.seconds)
    idle_since = time.monotonic()
    reconsumed = refused = 0
    while not stop:
        try:
            got = consumer.receive(max_nums=args.max_nums, wait_ms=200)
        except CommitConflictError:
            continue
        if not got:
            if time.monotonic() - idle_since >= args.idle_s:
                break
            continue
        idle_since = time.monotonic()
        ids = [body_id(m.body) for m in got]
        log.received(
            ids, reconsume=[m.reconsume_times for m in got], until=[m.invisible_until_ms for m in got]
        )
        batches += 1
        received += len(got)
        reconsumed += sum(1 for m in got if m.reconsume_times > 0)
        if batches == args.die_after_batches:
            _die()
        work_ms = (
            args.work_ms
            if args.work_ms_max <= args.work_ms
            else random.uniform(args.work_ms, args.work_ms_max)
        )
        time.sleep(work_ms / 1000)
        acked = []
        for m, mid in zip(got, ids, strict=True):
            try:
                consumer.ack(m)
                acked.append(mid)
            except InvalidReceiptHandleError:  # its invisible time ended first: it comes again
                refused += 1
        log.acked(acked, flushed=False)  # ack() called; the ack row is appended within ack_linger_ms
    consumer.close()  # flushes the buffered acks
    log.close()
    _out(batches=batches, received=received, reconsumed=reconsumed, refused=refused)


# --------------------------------------------------------------------------- broker work
def dispatch_loop(args: argparse.Namespace) -> None:
    from engine.broker.dispatch import dispatch_pending

    store = Store.open(args.store)
    stop = _Stop(args.seconds)
    passes = entries = conflicts = 0
    while not stop:
        try:
            entries += dispatch_pending(store)
        except CommitConflictError:
            conflicts += 1
        passes += 1
        time.sleep(args.interval_ms / 1000)
    _out(passes=passes, entries=entries, conflicts=conflicts)


def maintain_loop(args: argparse.Namespace) -> None:
    from engine.broker.maintenance import checkpoint, compact

    store = Store.open(args.store)
    stop = _Stop(args.seconds)
    passes = files_removed = compactions = 0
    errors: Counter[str] = Counter()
    while not stop:
        try:
            reports = compact(store, min_files=2)
            files_removed += sum(r["files_removed"] for r in reports.values())
            compactions += sum(r["version"] is not None for r in reports.values())
            if passes % 5 == 4:
                checkpoint(store)
        except MQError as exc:
            errors[type(exc).__name__] += 1
        passes += 1
        time.sleep(args.interval_ms / 1000)
    _out(passes=passes, compactions=compactions, files_removed=files_removed, errors=dict(errors))


# --------------------------------------------------------------------------- readers
def _topic_stats(store: str, topic: str) -> str | None:
    """``mq topic stats`` in a subprocess: None when it answered, else what went wrong (an untyped
    failure shows as a traceback, a typed one as ``mq: error: ...``)."""
    import subprocess

    done = subprocess.run(
        [sys.executable, "-m", "engine.cli", "topic", "stats", topic, "--store", store, "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if done.returncode == 0:
        json.loads(done.stdout)
        return None
    return done.stderr.strip()[-300:] or f"exit {done.returncode}"


def read_loop(args: argparse.Namespace) -> None:
    from engine.store import schemas

    seen = ReadCheck()
    errors: Counter[str] = Counter()
    untyped: list[str] = []
    stats_runs = pulled = passes = 0
    offsets: dict[int, int] = {}
    pending: set[str] = set()  # pulled, not yet seen in a commit-log read
    stop = _Stop(args.seconds)
    while not stop:
        passes += 1
        try:
            store = Store.open(args.store)
            version = store.version(schemas.COMMIT_LOG)
            rows = store.read(
                schemas.COMMIT_LOG, columns=["physical_offset", "topic", "queue_id", "queue_offset", "body"]
            ).to_pylist()
            # The read is at least as new as the version asked before it.
            seen.see(version, rows, args.topic)
            pending -= set(seen.rows.values())
            consumer = PullConsumer(store, args.group)
            for q in range(store.topic(args.topic).queues):
                result = consumer.pull(args.topic, q, offsets.get(q, 0), max_nums=32)
                if result.status is PullStatus.FOUND:
                    # checked against a later read: this pull may see commits newer than the read
                    pending.update(body_id(m.body) for m in result.messages)
                    pulled += len(result.messages)
                offsets[q] = result.next_begin_offset
            if args.stats_every and passes % args.stats_every == 0:
                stats_runs += 1
                failed = _topic_stats(args.store, args.topic)
                if failed is not None:
                    name = "untyped mq" if "Traceback" in failed else "mq: error"
                    if "Traceback" in failed:
                        untyped.append(failed)
                    errors[name] += 1
        except MQError as exc:
            errors[type(exc).__name__] += 1
        except Exception as exc:  # what the scenario looks for: none may leave a public call
            untyped.append(f"{type(exc).__name__}: {exc}"[:300])
        time.sleep(args.interval_ms / 1000)
    final = Store.open(args.store).read(schemas.COMMIT_LOG, columns=["topic", "body"]).to_pylist()
    phantoms = len(pending - {body_id(r["body"]) for r in final if r["topic"] == args.topic})
    _out(
        passes=passes,
        last_version=seen.version,
        rows=len(seen.rows),
        pulled=pulled,
        phantoms=phantoms,
        stats_runs=stats_runs,
        forks=seen.forks[:5],
        fork_count=len(seen.forks),
        torn=seen.torn[:5],
        torn_count=len(seen.torn),
        errors=dict(errors),
        untyped_errors=untyped[:5],
        untyped=len(untyped),
    )


# --------------------------------------------------------------------------- command line
def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tests.fault.workers")
    sub = p.add_subparsers(dest="role", required=True)

    def common(name: str) -> argparse.ArgumentParser:
        s = sub.add_parser(name)
        s.add_argument("--store", required=True)
        s.add_argument("--seconds", type=float, default=600.0, help="stop after this long at the latest")
        return s

    s = common("producer")
    s.add_argument("--topic", required=True)
    s.add_argument("--history", required=True)
    s.add_argument("--prefix", required=True)
    s.add_argument("--count", type=int, required=True)
    s.add_argument("--batch", type=int, default=0, help="messages per send_batch; 0 = sync sends")
    s.add_argument("--size", type=int, default=64)
    s.add_argument("--conflict-retries", type=int, default=0)
    s.add_argument("--pause-ms", type=float, default=0)
    s.add_argument(
        "--survive-errors", action="store_true", help="log a failed send as gave_up and go on sending"
    )
    s.add_argument("--error-pause-ms", type=float, default=200, help="with --survive-errors")
    for role in ("pull-consumer", "simple-consumer"):
        s = common(role)
        s.add_argument("--topic", required=True)
        s.add_argument("--group", required=True)
        s.add_argument("--history", required=True)
        s.add_argument("--consumer-id", required=True)
        s.add_argument("--max-nums", type=int, default=16)
        s.add_argument("--die-after-batches", type=int, default=0)
        s.add_argument("--work-ms", type=float, default=0, help="pause between receive and ack/commit")
        s.add_argument(
            "--work-ms-max", type=float, default=0, help="with --work-ms: a random pause up to this"
        )
        s.add_argument("--idle-s", type=float, default=2.0, help="stop after this long with nothing new")
        s.add_argument(
            "--until-stopped", action="store_true", help="run until SIGTERM, then until idle (pull only)"
        )
        if role == "simple-consumer":
            s.add_argument("--invisible-ms", type=int, default=3000)
    s = common("dispatcher")
    s.add_argument("--interval-ms", type=float, default=20)
    s = common("maintainer")
    s.add_argument("--interval-ms", type=float, default=100)
    s = common("reader")
    s.add_argument("--topic", required=True)
    s.add_argument("--group", default="fault-reader")
    s.add_argument("--interval-ms", type=float, default=0)
    s.add_argument("--stats-every", type=int, default=5, help="run `mq topic stats` every N passes; 0 never")
    return p


ROLES = {
    "producer": produce,
    "pull-consumer": pull_consume,
    "simple-consumer": simple_consume,
    "dispatcher": dispatch_loop,
    "maintainer": maintain_loop,
    "reader": read_loop,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    Path(getattr(args, "history", None) or ".").parent.mkdir(parents=True, exist_ok=True)
    ROLES[args.role](args)
    return 0


if __name__ == "__main__":
    code = main()
    # As the mq CLI: every outcome is fsynced and printed by now; pyarrow scan threads over delta-rs's
    # storage handler can abort the interpreter's teardown ("terminate called without an active
    # exception", SIGABRT), which would read as a crashed worker.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
