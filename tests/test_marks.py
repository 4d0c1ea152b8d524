"""Commit-log marks that do not grow with the number of topics (engine.store.commit_log.marks)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from deltalake import CommitProperties, write_deltalake

import engine.store.commit_log.writer as sequencer
import engine.store.delta.direct_append as direct_append
from engine import Store
from engine.store import schemas
from engine.store.commit_log import CommitLogWriter
from engine.store.commit_log.hwm import read_hwm
from engine.store.commit_log.marks import (
    COVER_COMMITS,
    MIN_SLICE,
    HighWaterMarks,
    MarksDelta,
    Rebuild,
    covering,
    replay,
    slice_size,
)
from engine.store.commit_log.stamping import PendingMessage, stamp
from engine.store.commit_markers import HWM_KEY, MARKS_KEY
from engine.store.delta import RENEW_HANDLE_COMMITS


def _msg(topic: str, qid: int, body: bytes = b"x") -> PendingMessage:
    return PendingMessage(topic, qid, body, f"u-{topic}-{qid}-{body!r}")


def _log_json(store: Store, version: int) -> dict[str, object]:
    path = Path(store.uri(schemas.COMMIT_LOG)) / "_delta_log" / f"{version:020d}.json"
    for line in path.read_text().splitlines():
        action = json.loads(line)
        if "commitInfo" in action:
            return dict(action["commitInfo"])
    raise AssertionError(f"version {version} has no commitInfo")


def test_a_commit_names_its_queues_and_a_bounded_slice_not_every_queue(store: Store) -> None:
    writer = CommitLogWriter(store)
    topics = [f"topic-{i:03d}" for i in range(300)]
    writer.append([_msg(t, q) for t in topics for q in range(4)])  # 1,200 queues in use
    for i in range(8):
        writer.append([_msg(topics[i], i % 4, b"y")])
    latest = store.version(schemas.COMMIT_LOG)
    for version in range(latest - 7, latest + 1):
        info = _log_json(store, version)
        assert HWM_KEY not in info
        assert len(json.dumps(info)) <= 4096
        named = sum(len(q) for q in json.loads(str(info[MARKS_KEY]))["q"].values())
        assert named <= slice_size(1200) + 1
        assert json.loads(str(info[MARKS_KEY]))["n"] == 1200


def test_a_reader_rebuilds_the_writers_marks_from_compact_marks(store: Store) -> None:
    writer = CommitLogWriter(store)
    writer.append([_msg(f"t{i}", q) for i in range(100) for q in range(3)])
    for i in range(40):
        writer.append([_msg(f"t{i % 7}", i % 3, b"%d" % i), _msg("late", 5, b"%d" % i)])
    written = writer._hwm
    assert written is not None
    rebuilt = read_hwm(store.snapshot(schemas.COMMIT_LOG))
    assert rebuilt.to_json() == written.to_json()
    assert rebuilt.next_queue_offset("late", 5) == 40 and rebuilt.next_queue_offset("late", 0) == 0
    assert rebuilt.next_queue_offset("t3", 0) == 1 + sum(1 for i in range(40) if i % 7 == 3 and i % 3 == 0)


def test_marks_as_of_an_older_version_ignore_newer_commits(store: Store) -> None:
    writer = CommitLogWriter(store)
    writer.append([_msg("a", 0), _msg("a", 1)])
    writer.append([_msg("a", 0, b"2")])
    old = store.version(schemas.COMMIT_LOG)
    writer.append([_msg("a", 0, b"3"), _msg("b", 0)])
    marks = read_hwm(store.snapshot(schemas.COMMIT_LOG, old))
    assert marks.queues == {"a": [2, 1]}


def test_a_store_with_full_marks_in_every_commit_is_read_and_continued(store: Store) -> None:
    """Stores written before compact marks carry the full ``mq.hwm`` in every commit."""
    uri = store.uri(schemas.COMMIT_LOG)
    old = HighWaterMarks()
    for n in range(3):
        rows, _, delta = stamp([_msg("old", 1, b"%d" % n)], old, store.store_id, 1000 + n)
        old.apply(delta)
        full = CommitProperties({HWM_KEY: old.to_json()})
        write_deltalake(uri, rows, mode="append", commit_properties=full)
    assert read_hwm(store.snapshot(schemas.COMMIT_LOG)).queues == {"old": [0, 3]}
    writer = CommitLogWriter(store)
    [stamped] = writer.append([_msg("old", 1, b"new")])
    assert stamped.queue_offset == 3
    writer.append([_msg("other", 0)])
    assert read_hwm(store.snapshot(schemas.COMMIT_LOG)).queues == {"old": [0, 4], "other": [1]}


def test_a_writer_that_lost_races_applies_the_missed_commits_and_keeps_offsets_dense(store: Store) -> None:
    first, second = CommitLogWriter(store, host_lock=False), CommitLogWriter(store, host_lock=False)
    offsets: list[int] = []
    for i in range(6):
        writer = first if i % 2 else second
        offsets += [s.queue_offset for s in writer.append([_msg("q", 0, b"%d" % i), _msg(f"x{i}", 0)])]
    assert offsets[::2] == list(range(6))
    for writer in (first, second):
        writer.append([_msg("q", 0, b"end")])
    assert read_hwm(store.snapshot(schemas.COMMIT_LOG)).next_queue_offset("q", 0) == 8


def test_rebuild_is_incomplete_until_every_queue_is_named() -> None:
    rebuild = Rebuild(HWM_KEY, MARKS_KEY)
    newest = {MARKS_KEY: json.dumps({"p": 9, "t": 5, "n": 3, "q": {"a": {"0": 4}}})}
    older = {MARKS_KEY: json.dumps({"p": 7, "t": 4, "n": 3, "q": {"a": {"0": 3, "1": 2}}})}
    assert not rebuild.add(newest)
    assert not rebuild.add({"operation": "OPTIMIZE"})  # a commit without marks changes nothing
    assert not rebuild.add(older)
    assert rebuild.result() is None
    assert rebuild.add({MARKS_KEY: json.dumps({"p": 1, "t": 1, "n": 3, "q": {"b": {"0": 1}}})})
    marks = rebuild.result()
    assert marks is not None
    assert (marks.physical, marks.store_ts_ms, marks.queues) == (9, 5, {"a": [4, 2], "b": [1]})


def test_rebuild_stops_at_a_full_mark_and_keeps_the_newer_values() -> None:
    rebuild = Rebuild(HWM_KEY, MARKS_KEY)
    assert not rebuild.add({MARKS_KEY: json.dumps({"p": 9, "t": 5, "n": 5, "q": {"a": {"2": 7}}})})
    assert rebuild.add({HWM_KEY: HighWaterMarks(4, 3, {"a": [1, 1, 1], "b": [2, 2]}).to_json()})
    marks = rebuild.result()
    assert marks is not None
    assert (marks.physical, marks.queues) == (9, {"a": [1, 1, 7], "b": [2, 2]})


def test_covering_keeps_only_the_newest_commits_that_name_every_queue_and_replays_to_the_same_marks() -> None:
    def mark(p: int, queues: dict[str, dict[str, int]]) -> dict[str, str]:
        return {MARKS_KEY: json.dumps({"p": p, "t": p, "n": 3, "q": queues})}

    oldest_first = [
        mark(1, {"a": {"0": 1}}),
        mark(2, {"a": {"0": 2, "1": 1}}),
        {"operation": "OPTIMIZE"},
        mark(3, {"b": {"0": 5}}),
        mark(4, {"a": {"1": 2}}),
        mark(5, {"a": {"0": 3}, "b": {"0": 6}}),
    ]
    seen: list[dict[str, str]] = []

    def newest_first() -> object:
        for info in reversed(oldest_first):
            seen.append(info)
            yield info

    needed = covering(newest_first(), HWM_KEY, MARKS_KEY)  # type: ignore[arg-type]
    assert needed == oldest_first[-2:]  # the newest two name a/0, a/1 and b/0
    assert seen == needed[::-1]  # and nothing older was looked at
    everything, some = HighWaterMarks(), HighWaterMarks()
    replay(everything, oldest_first, HWM_KEY, MARKS_KEY)
    replay(some, needed, HWM_KEY, MARKS_KEY)
    assert (
        (some.physical, some.queues)
        == (everything.physical, everything.queues)
        == (5, {"a": [3, 2], "b": [6]})
    )
    # commits that never name every queue: all of them are needed, from a full mark on
    assert covering(reversed(oldest_first[:2]), HWM_KEY, MARKS_KEY) == oldest_first[:2]
    full = {HWM_KEY: HighWaterMarks(9, 9, {"a": [7, 7], "b": [7]}).to_json()}
    assert covering(reversed([mark(1, {}), full, mark(10, {"a": {"0": 8}})]), HWM_KEY, MARKS_KEY) == [
        full,
        mark(10, {"a": {"0": 8}}),
    ]


def test_a_writer_following_many_rivals_parses_only_the_newest_commit_and_keeps_offsets_dense(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    writers = [CommitLogWriter(store, host_lock=False) for _ in range(4)]
    for w in writers:
        w.append([_msg("q", 0, b"warm")])
    for i in range(12):  # writers 1..3 commit 12 times while writer 0 waits
        writers[1 + i % 3].append([_msg("q", i % 2, b"%d" % i)])
    parsed: list[int] = []
    real = direct_append.LogCommit.commit_info

    def counting(self: direct_append.LogCommit) -> object:
        parsed.append(self.version)
        return real.fget(self)  # type: ignore[attr-defined]

    monkeypatch.setattr(direct_append.LogCommit, "commit_info", property(counting))
    follows_from = store.version(schemas.COMMIT_LOG)
    [stamped] = writers[0].append([_msg("q", 1, b"last")])
    # the newest commit named every queue: the 11 before it stayed unparsed (its own value is cached)
    assert set(parsed) == {follows_from}
    assert stamped.queue_offset == 6  # the warm-ups went to q/0, 6 of the 12 to q/1
    assert read_hwm(store.snapshot(schemas.COMMIT_LOG)).queues["q"] == [4 + 6, 7]


def test_compact_marks_rotate_over_every_queue() -> None:
    marks = HighWaterMarks(0, 0, {f"t{i}": [i, i + 1] for i in range(100)})
    named: set[tuple[str, int]] = set()
    per_commit = slice_size(marks.queue_count)
    assert per_commit == max(MIN_SLICE, -(-200 // COVER_COMMITS))
    for version in range(200 // per_commit + 1):
        delta, known = MarksDelta.from_compact_json(marks.compact_json(MarksDelta(0, 0, {}), version))
        assert known == 200
        named |= {(t, q) for t, qs in delta.queues.items() for q in qs}
        values = [(t, q, v) for t, qs in delta.queues.items() for q, v in qs.items()]
        assert all(marks.next_queue_offset(t, q) == v for t, q, v in values)
    assert len(named) == 200


def test_apply_pads_new_queues_counts_them_and_never_moves_back() -> None:
    marks = HighWaterMarks(20, 9, {"a": [1]})
    assert marks.queue_count == 1
    marks.apply(MarksDelta(30, 5, {"a": {3: 2}, "b": {0: 1}}))
    assert marks.queues == {"a": [1, 0, 0, 2], "b": [1]} and marks.queue_count == 5
    assert (marks.physical, marks.store_ts_ms) == (30, 9)


def test_a_long_lived_writer_keeps_its_marks_in_memory_across_handle_renewals(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer, other = CommitLogWriter(store), CommitLogWriter(store, host_lock=False)
    writer.append([_msg(f"t{i}", 0) for i in range(50)])
    other.append([_msg("t2", 0, b"first")])  # both have read the marks once

    def no_rebuild(snapshot: object) -> HighWaterMarks:
        raise AssertionError("the writer rebuilt its marks from the log")

    monkeypatch.setattr(sequencer, "read_hwm", no_rebuild)
    for i in range(RENEW_HANDLE_COMMITS + 5):
        writer.append([_msg("t1", 0, b"%d" % i)])
        if i % 10 == 0:
            other.append([_msg("t2", 0, b"o%d" % i)])  # commits the writer must replay
    assert writer._dt is not None and writer._dt.moved_since_open < RENEW_HANDLE_COMMITS
    monkeypatch.undo()
    assert writer._hwm is not None
    assert writer._hwm.to_json() == read_hwm(store.snapshot(schemas.COMMIT_LOG)).to_json()
