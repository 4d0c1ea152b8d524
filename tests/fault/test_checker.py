"""The fault checker itself: a clean store passes, and each kind of damage is reported.

Not marked ``fault``: these are fast unit tests of the harness, and they prove the checker can fail.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from engine import Admin, Message, Producer, Store
from engine.broker.dispatch import dispatch_pending
from engine.store import schemas
from tests.fault.history import (
    Figures,
    History,
    HistoryLog,
    ReadCheck,
    body_id,
    check,
    load_results,
    make_body,
    previous_results,
    record,
    render_faults,
    write_faults,
)
from tests.helpers import commit_log_rows
from tests.raw_delta import raw_table


def _produce(store: Store, topic: str, log: HistoryLog, n: int) -> None:
    ids = [f"m{i}" for i in range(n)]
    with Producer(store) as producer:
        for mid in ids:
            log.sent([mid])
            producer.send(Message(topic, make_body(mid, 64)))
            log.acknowledged([mid])


def _append_rows(store: Store, table: str, rows: list[dict[str, Any]]) -> None:
    """Raw rows straight into a table, around the sequencer: the damage the checker must see."""
    store.shared(table)  # catch up with damage done behind the store's back
    store.append(table, pa.Table.from_pylist(rows, schema=schemas.SCHEMAS[table]))


def _after_last(store: Store, queue_offsets_ahead: int) -> dict[str, Any]:
    """A copy of the last commit-log row, placed right after it in the log and ``queue_offsets_ahead``
    past the end of its queue (1: the next offset)."""
    rows: list[dict[str, Any]] = commit_log_rows(store)
    last = rows[-1]
    end = max(r["queue_offset"] for r in rows if r["queue_id"] == last["queue_id"])
    return dict(
        last,
        physical_offset=last["physical_offset"] + last["size"],
        queue_offset=end + queue_offsets_ahead,
    )


def _clean_store(store: Store, topic: str, tmp_path: Path, n: int = 12) -> History:
    with HistoryLog(tmp_path / "producer.jsonl") as log:
        _produce(store, topic, log, n)
    dispatch_pending(store)
    return History.load(tmp_path)


def test_body_carries_its_id_at_the_front() -> None:
    body = make_body("p1-7", 100)
    assert len(body) == 100
    assert body_id(body) == "p1-7"
    assert body_id(make_body("x")) == "x"


def test_a_clean_store_reports_zero_everywhere(store: Store, topic: str, tmp_path: Path) -> None:
    history = _clean_store(store, topic, tmp_path)
    history.add("received", [f"m{i}" for i in range(12)])
    history.add("acked", [f"m{i}" for i in range(10)])

    figures = check(store, history, topics=[topic], consumed=True, dispatched=True)

    assert figures.ok, figures.problems
    assert (figures.sent, figures.acknowledged, figures.stored, figures.received) == (12, 12, 12, 12)
    assert (figures.acknowledged_lost, figures.log_duplicates) == (0, 0)
    assert (figures.offsets_not_dense, figures.offsets_not_monotonic) == (0, 0)
    assert (figures.never_seen, figures.undispatched, figures.redelivered) == (0, 0, 0)
    assert figures.consumer_acked == 10
    figures.assert_ok()


def test_an_acknowledged_message_missing_from_the_log_is_reported_lost(
    store: Store, topic: str, tmp_path: Path
) -> None:
    history = _clean_store(store, topic, tmp_path)
    history.add("acknowledged", ["ghost"])

    figures = check(store, history, topics=[topic])

    assert figures.acknowledged_lost == 1
    assert any("ghost" in p for p in figures.problems)
    assert not figures.ok


def test_a_message_stored_twice_is_a_log_duplicate(store: Store, topic: str, tmp_path: Path) -> None:
    history = _clean_store(store, topic, tmp_path)
    copy = _after_last(store, 1)  # same message (same body), stored again
    _append_rows(store, schemas.COMMIT_LOG, [copy])

    figures = check(store, history, topics=[topic])

    assert figures.log_duplicates == 1
    assert figures.acknowledged_lost == 0
    assert (figures.offsets_not_dense, figures.offsets_not_monotonic) == (0, 0)


def test_a_commit_log_entry_indexed_twice_is_a_log_duplicate(
    store: Store, topic: str, tmp_path: Path
) -> None:
    history = _clean_store(store, topic, tmp_path)
    entry = store.read(schemas.CONSUME_QUEUE).to_pylist()[0]
    _append_rows(store, schemas.CONSUME_QUEUE, [entry])

    figures = check(store, history, topics=[topic])

    assert figures.log_duplicates == 1
    assert figures.offsets_not_dense == 1  # the queue's offsets now repeat one
    assert any("indexed 2 times" in p for p in figures.problems)


def test_a_hole_in_a_queue_is_reported_not_dense(store: Store, topic: str, tmp_path: Path) -> None:
    history = _clean_store(store, topic, tmp_path)
    skipped = dict(_after_last(store, 2), body=make_body("extra", 64))
    _append_rows(store, schemas.COMMIT_LOG, [skipped])

    figures = check(store, history, topics=[topic])

    assert figures.offsets_not_dense == 1
    assert figures.offsets_not_monotonic == 0
    assert any("missing" in p for p in figures.problems)


def test_a_queue_offset_going_backwards_is_reported_not_monotonic(
    store: Store, topic: str, tmp_path: Path
) -> None:
    history = _clean_store(store, topic, tmp_path)
    rows = commit_log_rows(store)
    # Swap the queue offsets of a queue's first two messages: still dense, no longer in commit order.
    first, second = [r for r in rows if r["queue_id"] == 0][:2]
    swapped = [dict(first, queue_offset=1), dict(second, queue_offset=0)]
    dt = raw_table(store, schemas.COMMIT_LOG)
    dt.delete("queue_id = 0 and queue_offset < 2")
    _append_rows(store, schemas.COMMIT_LOG, swapped)

    figures = check(store, history, topics=[topic])

    assert figures.offsets_not_monotonic >= 1
    assert figures.offsets_not_dense == 0
    assert figures.acknowledged_lost == 0


def test_a_physical_offset_hole_is_reported(store: Store, topic: str, tmp_path: Path) -> None:
    history = _clean_store(store, topic, tmp_path)
    raw_table(store, schemas.COMMIT_LOG).delete("queue_id = 1 and queue_offset = 2")
    history.acknowledged.discard("m9")  # m9 went to queue 1 at offset 2: not an acknowledged loss here

    figures = check(store, history, topics=[topic])

    assert figures.acknowledged_lost == 0
    assert figures.offsets_not_dense >= 2  # the physical sequence and queue 1
    assert any("physical offset" in p for p in figures.problems)


def test_physical_offsets_that_go_back_in_commit_order_are_reported_not_monotonic(store: Store) -> None:
    Admin(store).create_topic("O", 2)
    row = {
        "topic": "O",
        "queue_offset": 0,
        "msg_id": "X",
        "tags_code": 0,
        "size": 100,
        "born_ts_ms": 1,
        "store_ts_ms": 1,
        "sys_flag": 0,
        "delay_level": 0,
        "reconsume_times": 0,
    }
    # Dense and unique as a set, but the later commit holds the lower offsets.
    _append_rows(
        store, schemas.COMMIT_LOG, [dict(row, physical_offset=100, queue_id=0, uniq_key="b", body=b"b#")]
    )
    _append_rows(
        store, schemas.COMMIT_LOG, [dict(row, physical_offset=0, queue_id=1, uniq_key="a", body=b"a#")]
    )

    figures = check(store, History(), topics=["O"])

    assert figures.offsets_not_monotonic == 1
    assert (figures.offsets_not_dense, figures.log_duplicates) == (0, 0)
    assert any("not past" in p for p in figures.problems)


def test_undispatched_and_never_received_messages_are_counted(
    store: Store, topic: str, tmp_path: Path
) -> None:
    with HistoryLog(tmp_path / "producer.jsonl") as log:
        _produce(store, topic, log, 4)
    history = History.load(tmp_path)
    history.add("received", ["m0", "m1", "m1"])

    figures = check(store, history, topics=[topic], consumed=True, dispatched=True)

    assert figures.undispatched == 4
    assert figures.never_seen == 2
    assert figures.redelivered == 1
    assert not figures.ok


def test_a_torn_last_line_is_an_event_that_never_happened(tmp_path: Path) -> None:
    with HistoryLog(tmp_path / "a.jsonl") as log:
        log.sent(["a", "b"])
        log.acknowledged(["a"])
    with open(tmp_path / "a.jsonl", "ab") as f:
        f.write(b'{"e": "acknowledged", "ids": ["b"')  # killed in the middle of this write
    with HistoryLog(tmp_path / "b.jsonl") as log:
        log.received(["a"])
        log.received(["a"])
        log.gave_up(["c"])

    history = History.load(tmp_path)

    assert history.sent == {"a", "b"}
    assert history.acknowledged == {"a"}
    assert history.gave_up == {"c"}
    assert history.received["a"] == 2


def test_records_become_a_report_that_keeps_scenarios_not_run_again(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("MQ_FAULT_RESULTS", str(tmp_path / "results.jsonl"))
    history = History(sent={"a", "b"}, acknowledged={"a", "b"})
    figures_ok = _figures(history)
    record("first", figures_ok, kills=3)
    record("second", figures_ok)
    rows = load_results()
    old = render_faults(rows)

    bad = _figures(history, lost=1)
    text = render_faults([dict(load_results()[0], acknowledged_lost=1)], previous_results(old))

    assert [r["scenario"] for r in rows] == ["first", "second"]
    assert "| first |" in text
    assert "second (earlier run)" in text
    assert "kills=3" in old
    assert "0 in every scenario: yes" in old
    assert "0 in every scenario: NO" in text
    assert bad.acknowledged_lost == 1


def test_object_store_scenarios_get_a_section_of_their_own(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("MQ_FAULT_RESULTS", str(tmp_path / "results.jsonl"))
    figures = _figures(History(sent={"a"}, acknowledged={"a"}))
    record("on disk", figures)
    record("on s3", figures, storage="s3")
    with pytest.raises(ValueError, match="unknown storage"):
        record("elsewhere", figures, storage="tape")  # type: ignore[arg-type]

    text = render_faults(load_results())
    # an earlier report's rows without a storage field are local ones
    old = render_faults([{k: v for k, v in r.items() if k != "storage"} for r in load_results()])

    local, s3 = text.index("## On a local disk"), text.index("## On object storage")
    assert local < text.index("| on disk |") < s3 < text.index("| on s3 |")
    assert "## On object storage" not in old and "| on s3 |" in old


def test_rows_of_tests_that_no_longer_exist_leave_the_report(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("MQ_FAULT_RESULTS", str(tmp_path / "results.jsonl"))
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text("def test_kept():\n    pass\n")
    figures = _figures(History(sent={"a"}, acknowledged={"a"}))
    for scenario, test in [("kept", "test_kept"), ("renamed", "test_gone"), ("rerun", "test_kept2")]:
        monkeypatch.setenv("PYTEST_CURRENT_TEST", f"tests/test_x.py::{test}[p] (call)")
        record(scenario, figures)
    report = tmp_path / "FAULTS.md"
    write_faults(report, load_results(), tmp_path)
    (tmp_path / "results.jsonl").unlink()

    monkeypatch.setenv("PYTEST_CURRENT_TEST", "tests/test_x.py::test_new (call)")
    record("new", figures)
    write_faults(report, load_results(), tmp_path)
    text = report.read_text()

    assert "| new |" in text
    assert "| kept (earlier run) |" in text
    assert "renamed" not in text
    assert "rerun" not in text

    # Once the file is collected, only the collected ids count (a test that became parametrized).
    record("new", figures)
    write_faults(report, load_results(), tmp_path, collected=["tests/test_x.py::test_new"])
    assert "kept" not in report.read_text()


def _figures(history: History, lost: int = 0) -> Figures:
    return Figures(
        sent=len(history.sent),
        acknowledged=len(history.acknowledged),
        gave_up=0,
        stored=len(history.acknowledged) - lost,
        received=0,
        redelivered=0,
        acknowledged_lost=lost,
        log_duplicates=0,
        offsets_not_dense=0,
        offsets_not_monotonic=0,
    )


def test_a_reader_flags_a_table_that_went_back_forked_or_tore() -> None:
    def row(offset: int, mid: str, queue_offset: int) -> dict[str, Any]:
        return {
            "physical_offset": offset,
            "topic": "T",
            "queue_id": 0,
            "queue_offset": queue_offset,
            "body": make_body(mid),
        }

    seen = ReadCheck()
    seen.see(3, [row(0, "a", 0), row(10, "b", 1)], "T")
    seen.see(4, [row(0, "a", 0), row(10, "b", 1), row(20, "c", 2)], "T")
    assert (seen.forks, seen.torn) == ([], [])

    seen.see(2, [row(0, "a", 0), row(10, "b", 1), row(20, "c", 2)], "T")  # an older version
    seen.see(5, [row(0, "a", 0), row(10, "x", 1), row(20, "c", 2)], "T")  # a row changed under it
    seen.see(6, [row(0, "a", 0), row(10, "x", 1), row(20, "c", 2), row(30, "d", 4)], "T")  # a hole
    assert len(seen.forks) == 2 and "went back" in seen.forks[0] and "was b, now x" in seen.forks[1]
    assert len(seen.torn) == 1 and "queue 0" in seen.torn[0]
