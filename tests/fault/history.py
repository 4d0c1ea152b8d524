"""Fault-injection harness: what a scenario did (a history), what the store holds (a check), and the
record that ends up in ``FAULTS.md``.

A scenario gives every message a unique id and writes it at the front of the body
(:func:`make_body`). Each process keeps its own append-only JSON-lines file (:class:`HistoryLog`) and
writes an event there, flushed and fsynced, *before* doing anything else with the outcome: a
producer logs an acknowledgement as soon as ``send`` returns, so a SIGKILL right after still leaves
the ack on disk. :meth:`History.load` merges the files of every process (a torn last line, from a
kill in the middle of a write, is an event that never happened). :func:`check` then compares the
history with the store's tables and returns :class:`Figures`:

- ``acknowledged_lost``: acknowledged by the store to a producer, absent from the commit log;
- ``log_duplicates``: a message stored twice in the commit log, a physical offset used twice, or
  one commit-log entry indexed twice in the consume queue;
- ``offsets_not_dense`` / ``offsets_not_monotonic``: queues (of the commit log and of the consume
  queue) whose queue offsets have a hole or a repeat, or do not rise with commit order; the commit
  log's physical offsets count as one more sequence (byte-dense, rising version by version), and a
  consume-queue entry that points at another row than its own counts as not monotonic;
- ``never_seen``: acknowledged messages no consumer received (scenarios that consume);
- ``undispatched``: stored messages missing from the consume queue (scenarios that dispatch);
- ``recovery_s``: set by the scenario (restart -> everything dispatched or consumable).
"""

from __future__ import annotations

import itertools
import json
import os
import platform
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa

from engine import Store
from engine.model import UNDISPATCHED_FLAGS
from engine.protocol.shards import SHARD_SHIFT
from engine.store import schemas
from engine.store.delta.log import VERSION_COLUMN, read_versions

EventKind = Literal["sent", "acknowledged", "gave_up", "received", "acked"]
EVENT_KINDS: tuple[EventKind, ...] = ("sent", "acknowledged", "gave_up", "received", "acked")

_SEP = b"#"

# Where :func:`record` appends one line per scenario; tests/fault/conftest.py points it at a file of
# the current pytest session and turns the lines into FAULTS.md at the end of the session.
RESULTS_ENV = "MQ_FAULT_RESULTS"


# --------------------------------------------------------------------------- message ids
def make_body(message_id: str, size: int = 0) -> bytes:
    """A body that starts with ``message_id`` (no ``#`` in it), padded to ``size`` bytes."""
    if "#" in message_id or not message_id:
        raise ValueError(f"message id must be non-empty and without '#': {message_id!r}")
    head = message_id.encode() + _SEP
    return head + b"x" * max(0, size - len(head))


def body_id(body: bytes) -> str:
    """The message id a body made by :func:`make_body` starts with."""
    return bytes(body).split(_SEP, 1)[0].decode(errors="replace")


def misreported_offsets(store: Store, history_dir: Path, topic: str) -> int:
    """Acknowledged sends whose SendResult (queue id, queue offset, physical offset) is not where the
    message is stored in its commit-log shard: a result from a stamp that lost its race would show here."""
    stored: dict[str, tuple[int, int, int]] = {}
    for name in store.commit_logs:
        rows = store.read(name, columns=["topic", "queue_id", "queue_offset", "physical_offset", "body"])
        for row in rows.to_pylist():
            if row["topic"] == topic:
                stored[body_id(row["body"])] = (row["queue_id"], row["queue_offset"], row["physical_offset"])
    wrong = 0
    for path in history_dir.glob("*.jsonl"):
        for line in path.read_text().splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue  # a torn last line
            if event["e"] == "acknowledged" and "offsets" in event:
                for mid, reported in zip(event["ids"], event["offsets"], strict=True):
                    wrong += stored.get(mid) != tuple(reported)
    return wrong


# --------------------------------------------------------------------------- history
@dataclass
class History:
    """What the clients of a scenario saw, keyed by message id.

    ``sent``: a send was attempted; ``acknowledged``: the store confirmed it (a ``SendResult``);
    ``gave_up``: the producer stopped retrying (not acknowledged, so not lost either);
    ``received``/``acked``: times a consumer received / acknowledged (committed) it.
    """

    sent: set[str] = field(default_factory=set)
    acknowledged: set[str] = field(default_factory=set)
    gave_up: set[str] = field(default_factory=set)
    received: Counter[str] = field(default_factory=Counter)
    acked: Counter[str] = field(default_factory=Counter)

    def add(self, kind: EventKind, ids: Iterable[str]) -> None:
        """Record one event for each id (thread-safe enough for CPython's set/Counter updates)."""
        if kind not in EVENT_KINDS:
            raise ValueError(f"unknown event {kind!r}; events: {', '.join(EVENT_KINDS)}")
        getattr(self, kind).update(ids)  # a set, or a Counter that counts repeats

    def merge(self, other: History) -> None:
        self.sent |= other.sent
        self.acknowledged |= other.acknowledged
        self.gave_up |= other.gave_up
        self.received.update(other.received)
        self.acked.update(other.acked)

    @property
    def redelivered(self) -> int:
        """Deliveries beyond the first, over all messages."""
        return sum(n - 1 for n in self.received.values() if n > 1)

    @classmethod
    def load(cls, paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> History:
        """Merge per-process event files (a directory's ``*.jsonl``, or the files given).

        A line that does not parse can only be the last one of a file whose writer was killed in
        the middle of writing it; it is ignored, as the event was never recorded.
        """
        if isinstance(paths, (str, os.PathLike)) and Path(paths).is_dir():
            files = sorted(Path(paths).glob("*.jsonl"))
        elif isinstance(paths, (str, os.PathLike)):
            files = [Path(paths)]
        else:
            files = [Path(p) for p in paths]
        history = cls()
        for path in files:
            lines = path.read_bytes().split(b"\n")
            for i, line in enumerate(lines):
                if not line.strip():
                    continue
                try:
                    event = json.loads(line)
                except ValueError:
                    if i < len(lines) - 1 and any(rest.strip() for rest in lines[i + 1 :]):
                        raise ValueError(f"{path}: line {i + 1} is corrupt but is not the last one") from None
                    continue
                history.add(event["e"], event["ids"])
        return history


class HistoryLog:
    """One process's append-only event file; every event is flushed and fsynced before returning.

    Also feeds an in-memory :class:`History` (``self.history``) for in-process scenarios.
    """

    def __init__(self, path: str | os.PathLike[str], process: str | None = None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.process = process or f"{platform.node()}:{os.getpid()}"
        self.history = History()
        self._file = open(self.path, "ab")  # noqa: SIM115 - kept open for the process's life
        self._lock = threading.Lock()

    def event(self, kind: EventKind, ids: Sequence[str], **info: Any) -> None:
        """Make ``kind`` for ``ids`` durable, then count it."""
        if not ids:
            return
        line = json.dumps({"e": kind, "ids": list(ids), "p": self.process, "t": time.time(), **info})
        with self._lock:
            self._file.write(line.encode() + b"\n")
            self._file.flush()
            os.fsync(self._file.fileno())
            self.history.add(kind, ids)

    def sent(self, ids: Sequence[str], **info: Any) -> None:
        self.event("sent", ids, **info)

    def acknowledged(self, ids: Sequence[str], **info: Any) -> None:
        self.event("acknowledged", ids, **info)

    def gave_up(self, ids: Sequence[str], **info: Any) -> None:
        self.event("gave_up", ids, **info)

    def received(self, ids: Sequence[str], **info: Any) -> None:
        self.event("received", ids, **info)

    def acked(self, ids: Sequence[str], **info: Any) -> None:
        self.event("acked", ids, **info)

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> HistoryLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------- the check
@dataclass
class Figures:
    """What a scenario measured. In a correct store the problem counts (``acknowledged_lost`` to
    ``undispatched``) are 0; the others are volumes and times."""

    sent: int
    acknowledged: int
    gave_up: int
    stored: int
    received: int
    redelivered: int
    acknowledged_lost: int
    log_duplicates: int
    offsets_not_dense: int
    offsets_not_monotonic: int
    never_seen: int | None = None
    undispatched: int | None = None
    recovery_s: float | None = None
    consumer_acked: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No lost acknowledged message, no duplicate, dense and monotonic offsets, nothing unseen."""
        return not (
            self.acknowledged_lost
            or self.log_duplicates
            or self.offsets_not_dense
            or self.offsets_not_monotonic
            or self.never_seen
            or self.undispatched
        )

    def assert_ok(self) -> None:
        """The scenario's assertion: fails with every problem found."""
        assert self.acknowledged_lost == 0, self._explain("acknowledged messages lost")
        assert self.log_duplicates == 0, self._explain("duplicates in the logs")
        assert self.offsets_not_dense == 0, self._explain("offset sequences with holes")
        assert self.offsets_not_monotonic == 0, self._explain("offset sequences not monotonic")
        assert not self.never_seen, self._explain("acknowledged messages never received")
        assert not self.undispatched, self._explain("stored messages never dispatched")

    def _explain(self, what: str) -> str:
        shown = "\n  ".join(self.problems[:20])
        return f"{what}:\n  {shown}" + (
            f"\n  ... {len(self.problems) - 20} more" if len(self.problems) > 20 else ""
        )


def _sequence_problems(name: str, offsets: Sequence[int], from_zero: bool) -> tuple[bool, bool, list[str]]:
    """Dense / monotonic verdict for one queue's offsets listed in commit order."""
    problems: list[str] = []
    monotonic = all(b > a for a, b in itertools.pairwise(offsets))
    if not monotonic:
        bad = next(i for i, (a, b) in enumerate(itertools.pairwise(offsets)) if b <= a)
        problems.append(f"{name}: offset {offsets[bad + 1]} follows {offsets[bad]} in commit order")
    ordered = sorted(offsets)
    start = 0 if from_zero else (ordered[0] if ordered else 0)
    dense = ordered == list(range(start, start + len(ordered)))
    if not dense:
        have = set(ordered)
        holes = [o for o in range(start, (ordered[-1] if ordered else 0) + 1) if o not in have][:5]
        repeats = sorted(o for o, n in Counter(ordered).items() if n > 1)[:5]
        problems.append(f"{name}: not dense from {start}; missing {holes}, repeated {repeats}")
    return dense, monotonic, problems


def check(
    store: Store,
    history: History,
    *,
    topics: Iterable[str] | None = None,
    consumed: bool = False,
    dispatched: bool = False,
    retained: bool = False,
    id_of: Literal["body", "uniq_key"] = "body",
    recovery_s: float | None = None,
) -> Figures:
    """Compare a history with what the store's tables hold.

    Args:
        store: the scenario's store (read at its latest versions).
        history: every process's events.
        topics: the scenario's topics: message ids are looked for in their commit-log rows only
            (retry and dead-letter copies are other rows on purpose). Default: every non-system topic.
        consumed: the scenario consumed everything; count acknowledged messages never received.
        dispatched: the scenario ran dispatch to the end; count stored messages missing from the
            consume queue.
        retained: retention may have removed the oldest rows; queues need not start at offset 0, and
            physical offsets are not followed version by version.
        id_of: where a row's message id is: the body prefix (:func:`make_body`) or ``uniq_key``.
        recovery_s: the scenario's measured recovery time.
    """
    from engine.protocol import is_system_topic

    problems: list[str] = []
    id_column = "body" if id_of == "body" else "uniq_key"
    # Every commit-log shard (shard k's physical offsets start at k << 56, past every lower shard's).
    log = pa.concat_tables(
        [
            store.read(
                name,
                columns=[
                    "physical_offset",
                    "size",
                    "topic",
                    "queue_id",
                    "queue_offset",
                    "sys_flag",
                    id_column,
                ],
            )
            for name in store.commit_logs
        ]
    ).sort_by([("physical_offset", "ascending")])
    cq = store.read(
        schemas.CONSUME_QUEUE, columns=["topic", "queue_id", "queue_offset", "physical_offset", "log_version"]
    ).sort_by([("log_version", "ascending"), ("physical_offset", "ascending")])

    log_topics = log["topic"].to_pylist()
    wanted = set(topics) if topics is not None else {t for t in set(log_topics) if not is_system_topic(t)}
    raw_ids = log[id_column].to_pylist()
    ids = [body_id(v) if id_column == "body" else str(v) for v in raw_ids]
    physical = log["physical_offset"].to_pylist()
    sizes = log["size"].to_pylist()
    qids = log["queue_id"].to_pylist()
    qoffs = log["queue_offset"].to_pylist()
    flags = log["sys_flag"].to_pylist()

    # Messages of the scenario's topics: each stored once, every acknowledged one stored.
    stored = Counter(i for i, t in zip(ids, log_topics, strict=True) if t in wanted)
    duplicates = sum(n - 1 for n in stored.values() if n > 1)
    for mid, n in sorted(stored.items()):
        if n > 1:
            problems.append(f"commit_log: message {mid} stored {n} times")
    lost = sorted(history.acknowledged - stored.keys())
    problems.extend(f"commit_log: acknowledged message {mid} is not stored" for mid in lost)

    # Commit log: physical offsets unique, increasing and byte-dense; queue offsets per queue.
    not_dense = not_monotonic = 0
    phys_dups = sum(n - 1 for n in Counter(physical).values() if n > 1)
    if phys_dups:
        duplicates += phys_dups
        problems.append(f"commit_log: {phys_dups} physical offsets used twice")
    shard_of = [p >> SHARD_SHIFT for p in physical]
    holes = [
        i
        for i in range(1, len(physical))
        if shard_of[i] == shard_of[i - 1] and physical[i] != physical[i - 1] + sizes[i - 1]
    ]
    if holes and not retained:
        not_dense += 1
        i = holes[0]
        problems.append(
            f"commit_log: physical offset {physical[i]} follows {physical[i - 1]} + size {sizes[i - 1]}"
        )
    firsts = [i for i in range(len(physical)) if i == 0 or shard_of[i] != shard_of[i - 1]]
    for i in firsts if not retained else []:
        if physical[i] != shard_of[i] << SHARD_SHIFT:
            not_dense += 1
            problems.append(
                f"commit_log: first physical offset of shard {shard_of[i]} is {physical[i]}, not its base"
            )
    per_queue: dict[tuple[str, int], list[int]] = {}
    for t, q, o, f in zip(log_topics, qids, qoffs, flags, strict=True):
        if f in UNDISPATCHED_FLAGS:
            continue  # transaction halves and rollbacks take no queue offset
        per_queue.setdefault((t, q), []).append(o)
    for (t, q), offsets in sorted(per_queue.items()):
        dense, mono, found = _sequence_problems(f"commit_log {t}:{q}", offsets, not retained)
        not_dense += not dense
        not_monotonic += not mono
        problems.extend(found)

    for name in store.commit_logs if not retained else ():
        # Physical offsets rise with commit order: every version starts past everything before it.
        by_version = read_versions(
            store.uri(name),
            0,
            store.version(name),
            pa.schema([schemas.COMMIT_LOG_SCHEMA.field("physical_offset")]),
            store.storage_options,
        )
        spans: dict[int, tuple[int, int]] = {}
        for version, offset in zip(
            by_version[VERSION_COLUMN].to_pylist(), by_version["physical_offset"].to_pylist(), strict=True
        ):
            low, high = spans.get(version, (offset, offset))
            spans[version] = (min(low, offset), max(high, offset))
        seen_max = -1
        for version, (low, high) in sorted(spans.items()):
            if low <= seen_max:
                not_monotonic += 1
                problems.append(f"{name}: version {version} holds physical offset {low}, not past {seen_max}")
                break
            seen_max = max(seen_max, high)

    # Consume queue: each commit-log entry once, pointing at the right row, dense per queue.
    row_at = {p: (t, q, o) for p, t, q, o in zip(physical, log_topics, qids, qoffs, strict=True)}
    cq_topics = cq["topic"].to_pylist()
    cq_qids = cq["queue_id"].to_pylist()
    cq_offs = cq["queue_offset"].to_pylist()
    cq_phys = cq["physical_offset"].to_pylist()
    for p, n in Counter(cq_phys).items():
        if n > 1:
            duplicates += n - 1
            problems.append(f"consume_queue: commit-log entry at physical offset {p} indexed {n} times")
    cq_queue: dict[tuple[str, int], list[int]] = {}
    for t, q, o, p in zip(cq_topics, cq_qids, cq_offs, cq_phys, strict=True):
        cq_queue.setdefault((t, q), []).append(o)
        target = row_at.get(p)
        if target is not None and target != (t, q, o):
            not_monotonic += 1
            problems.append(
                f"consume_queue: entry {t}:{q}@{o} points at commit-log row {target} (physical {p})"
            )
        elif target is None and not retained:
            not_dense += 1
            problems.append(f"consume_queue: entry {t}:{q}@{o} points at missing physical offset {p}")
    for (t, q), offsets in sorted(cq_queue.items()):
        dense, mono, found = _sequence_problems(f"consume_queue {t}:{q}", offsets, not retained)
        not_dense += not dense
        not_monotonic += not mono
        problems.extend(found)

    undispatched: int | None = None
    if dispatched:
        indexed = set(cq_phys)
        missing = [
            (t, q, o)
            for p, t, q, o, f in zip(physical, log_topics, qids, qoffs, flags, strict=True)
            if t in wanted and f not in UNDISPATCHED_FLAGS and p not in indexed
        ]
        undispatched = len(missing)
        problems.extend(
            f"consume_queue: stored message {t}:{q}@{o} never dispatched" for t, q, o in missing[:20]
        )

    never_seen: int | None = None
    if consumed:
        unseen = sorted(history.acknowledged - set(history.received))
        never_seen = len(unseen)
        problems.extend(f"consumers: acknowledged message {mid} never received" for mid in unseen[:20])

    return Figures(
        sent=len(history.sent),
        acknowledged=len(history.acknowledged),
        gave_up=len(history.gave_up - history.acknowledged),
        stored=sum(stored.values()),
        received=len(history.received),
        redelivered=history.redelivered,
        acknowledged_lost=len(lost),
        log_duplicates=duplicates,
        offsets_not_dense=not_dense,
        offsets_not_monotonic=not_monotonic,
        consumer_acked=len(history.acked),
        never_seen=never_seen,
        undispatched=undispatched,
        recovery_s=recovery_s,
        problems=problems,
    )


class ReadCheck:
    """What one reader saw of the commit log while writers committed: the version never goes back,
    every row it read stays where it was (else ``forks``), each queue's offsets have no hole
    (else ``torn``). ``see`` takes one read: its version and rows (physical_offset, topic, queue_id,
    queue_offset, body)."""

    def __init__(self) -> None:
        self.rows: dict[int, str] = {}  # physical offset -> message id
        self.version = -1
        self.forks: list[str] = []
        self.torn: list[str] = []

    def see(self, version: int, rows: list[dict[str, Any]], topic: str) -> None:
        if version < self.version:
            self.forks.append(f"commit_log went back from version {self.version} to {version}")
        self.version = max(self.version, version)
        now = {int(r["physical_offset"]): body_id(r["body"]) for r in rows if r["topic"] == topic}
        for offset, mid in self.rows.items():
            if now.get(offset) != mid and len(self.forks) < 20:
                self.forks.append(f"row at physical offset {offset} was {mid}, now {now.get(offset)}")
        self.rows.update(now)
        queues: dict[int, list[int]] = {}
        for r in rows:
            if r["topic"] == topic:
                queues.setdefault(int(r["queue_id"]), []).append(int(r["queue_offset"]))
        for q, offsets in queues.items():
            if sorted(offsets) != list(range(len(offsets))) and len(self.torn) < 20:
                self.torn.append(f"version {version}: queue {q} holds offsets {sorted(offsets)[:10]}...")


# --------------------------------------------------------------------------- the record
Storage = Literal["local", "s3"]
# FAULTS.md's sections, in order: where the scenarios' stores were.
STORAGE_SECTIONS: dict[str, str] = {
    "local": "On a local disk",
    "s3": "On object storage (S3: SeaweedFS on 127.0.0.1, faults injected by `bench/s3proxy.py`)",
}


def results_path() -> Path:
    """The file :func:`record` appends to (``$MQ_FAULT_RESULTS``, set by the fault conftest)."""
    configured = os.environ.get(RESULTS_ENV)
    if configured:
        return Path(configured)
    return Path(os.environ.get("TMPDIR", "/tmp")) / f"lakemq-fault-results-{os.getuid()}.jsonl"


def record(scenario: str, figures: Figures, *, storage: Storage = "local", **extra: Any) -> None:
    """Append one scenario's figures (and scenario-specific ``extra`` numbers) to the results file.

    ``storage``: where the scenario's store was (FAULTS.md has a section per kind of storage).
    Call it before asserting, so a failing scenario is in the report too.
    """
    if storage not in STORAGE_SECTIONS:
        raise ValueError(f"unknown storage {storage!r}; one of {', '.join(STORAGE_SECTIONS)}")
    row: dict[str, Any] = {"scenario": scenario, "at": time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime())}
    row["storage"] = storage
    # The test that recorded it ("tests/fault/x.py::test_y[param]"), to tell stale rows apart later.
    row["test"] = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0]
    row.update({k: v for k, v in asdict(figures).items() if k != "problems"})
    row["problems"] = figures.problems[:5]
    row["extra"] = {k: v for k, v in extra.items()}
    path = results_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(row, default=str) + "\n")
        f.flush()


def load_results(path: str | os.PathLike[str] | None = None) -> list[dict[str, Any]]:
    p = Path(path) if path is not None else results_path()
    if not p.exists():
        return []
    return [json.loads(line) for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]


# --------------------------------------------------------------------------- FAULTS.md
_MARK_BEGIN = "<!-- fault-results"
_MARK_END = "-->"

_COLUMNS: tuple[tuple[str, str], ...] = (
    ("sent", "sent"),
    ("acknowledged", "acked by store"),
    ("gave_up", "gave up"),
    ("stored", "stored"),
    ("acknowledged_lost", "**lost acked**"),
    ("log_duplicates", "**log dups**"),
    ("offsets_not_dense", "not dense"),
    ("offsets_not_monotonic", "not monotonic"),
    ("received", "received"),
    ("consumer_acked", "consumer acked"),
    ("redelivered", "redelivered"),
    ("never_seen", "never seen"),
    ("undispatched", "undispatched"),
    ("recovery_s", "recovery s"),
)


def _cell(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


def machine_line() -> str:
    """Machine and versions, for the report's header."""
    from importlib.metadata import PackageNotFoundError, version

    def v(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "absent"

    root = Path(__file__).resolve().parents[2]

    def git(*args: str) -> subprocess.CompletedProcess[str] | None:
        try:
            return subprocess.run(
                ["git", *args], cwd=root, capture_output=True, text=True, check=False, timeout=10
            )
        except (OSError, subprocess.SubprocessError):
            return None

    head = git("rev-parse", "--short", "HEAD")
    commit = head.stdout.strip() if head is not None and head.returncode == 0 else "unknown"
    changed = git("status", "--porcelain", "--", "engine", "jobs", "tests")
    if changed is not None and changed.stdout.strip():
        commit += " with uncommitted changes"
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (
        f"{platform.system()} {platform.release()} {platform.machine()}, {os.cpu_count()} CPUs "
        f"(load average {load} at the end of the run, shared with other work); "
        f"Python {platform.python_version()}, deltalake {v('deltalake')}, pyarrow {v('pyarrow')}, "
        f"pyspark {v('pyspark')}; commit {commit}"
    )


def previous_results(text: str) -> list[dict[str, Any]]:
    """The machine-readable rows embedded in an earlier FAULTS.md."""
    start = text.find(_MARK_BEGIN)
    if start < 0:
        return []
    end = text.find(_MARK_END, start)
    body = text[start + len(_MARK_BEGIN) : end if end >= 0 else None]
    rows = []
    for line in body.splitlines():
        if line.strip():
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
    return rows


def render_faults(rows: Sequence[Mapping[str, Any]], previous: Sequence[Mapping[str, Any]] = ()) -> str:
    """FAULTS.md: this run's rows, plus rows of scenarios that did not run this time (marked)."""
    current = {r["scenario"]: r for r in rows}
    kept = [r for r in previous if r["scenario"] not in current]
    all_rows = sorted([*current.values(), *kept], key=lambda r: (str(r.get("test", "")), str(r["scenario"])))
    stale = {str(r["scenario"]) for r in kept}
    clean = all(not r.get("acknowledged_lost") and not r.get("log_duplicates") for r in all_rows)
    ordered = all(not r.get("offsets_not_dense") and not r.get("offsets_not_monotonic") for r in all_rows)
    out = [
        "# Fault-injection results",
        "",
        "Generated by the fault suite: `./test.sh -m fault` (or",
        "`.venv/bin/python -m pytest tests/fault -m fault`); `tests/fault/conftest.py` rewrites this file",
        "at the end of any session in which a fault scenario ran. Do not edit it by hand.",
        "",
        "Each scenario records a history (sent, acknowledged by the store, gave up, received, acked) in",
        "per-process fsynced JSON-lines files and `tests/fault/history.py:check` compares it with the",
        "commit log and consume queue. Every scenario test also *asserts* that no acknowledged message is",
        "lost, nothing is duplicated in the logs and every queue's offsets are dense and monotonic.",
        "",
        f"Machine: {machine_line()}.",
        "",
        "**Lost acknowledged messages and log duplicates are 0 in every scenario: "
        f"{'yes' if clean else 'NO'}.**",
        f"Offsets dense and monotonic in every scenario: {'yes' if ordered else 'NO'}.",
        "",
    ]
    for storage, title in STORAGE_SECTIONS.items():
        section = [r for r in all_rows if r.get("storage", "local") == storage]
        if not section:
            continue
        out += [
            f"## {title}",
            "",
            "| scenario | " + " | ".join(title for _, title in _COLUMNS) + " | other figures | run at |",
            "|---|" + "---:|" * len(_COLUMNS) + "---|---|",
        ]
        for r in section:
            extra = ", ".join(f"{k}={_cell(v)}" for k, v in sorted((r.get("extra") or {}).items()))
            name = str(r["scenario"]) + (" (earlier run)" if r["scenario"] in stale else "")
            out.append(
                f"| {name} | "
                + " | ".join(_cell(r.get(key)) for key, _ in _COLUMNS)
                + f" | {extra} | {r.get('at', '')} |"
            )
        out.append("")
    out.pop()  # the blank line after the last table
    problems = [(r["scenario"], p) for r in all_rows for p in r.get("problems") or []]
    if problems:
        out += ["", "## Problems found", ""]
        out += [f"- {s}: {p}" for s, p in problems]
    out += [
        "",
        "Columns: *sent* messages a producer tried to send; *acked by store* sends that returned a",
        "result; *gave up* sends abandoned after `CommitConflictError` (not acknowledged, so not lost);",
        "*stored* rows of the scenario's topics in the commit log; *lost acked* acknowledged but not",
        "stored; *log dups* a message stored twice or a commit-log entry indexed twice; *not dense* /",
        "*not monotonic* queues (commit log, consume queue, physical offsets) with a hole or a repeat /",
        "not rising with commit order; *received* / *consumer acked* distinct messages consumers received /",
        "acknowledged (acked, or offset committed past them); *redelivered*",
        "deliveries beyond the first; *never seen* acknowledged but never received; *undispatched*",
        "stored but missing from the consume queue; *recovery s* restart -> everything dispatched or",
        "consumable. – means the scenario does not measure it.",
        "",
        _MARK_BEGIN,
        *(json.dumps(r, sort_keys=True, default=str) for r in all_rows),
        _MARK_END,
        "",
    ]
    return "\n".join(out)


def test_still_exists(root: Path, test: str) -> bool:
    """Whether ``file.py::test_name[params]`` still names a test function under ``root``."""
    file, _, name = test.partition("::")
    function = name.split("[", 1)[0]
    path = root / file
    return (
        bool(file and function) and path.exists() and f"def {function}(" in path.read_text(encoding="utf-8")
    )


def write_faults(
    path: str | os.PathLike[str],
    rows: Sequence[Mapping[str, Any]],
    root: Path,
    collected: Iterable[str] = (),
) -> None:
    """Rewrite FAULTS.md with ``rows``; rows of an earlier run are kept only for tests that did not
    record this time and still exist (renamed or removed scenarios disappear).

    ``collected``: the test ids this session collected (selected or not); a test of a collected file
    exists exactly when it is among them, a test of another file when its function is still there.
    """
    p = Path(path)
    previous = previous_results(p.read_text(encoding="utf-8")) if p.exists() else []
    tests_now = {r.get("test") for r in rows}
    known = set(collected)
    files = {test.split("::", 1)[0] for test in known}

    def exists(test: str) -> bool:
        if test.split("::", 1)[0] in files:
            return test in known
        return test_still_exists(root, test)

    kept = [r for r in previous if r.get("test") and r["test"] not in tests_now and exists(str(r["test"]))]
    p.write_text(render_faults(rows, kept), encoding="utf-8")
