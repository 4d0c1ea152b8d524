"""The ``mq`` operations commands (mqadmin's essentials): each one's table output, its ``--json``
document parsed back, and bad input as a one-line error."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engine import Admin, Message, Producer, PullConsumer, Store
from engine.broker.dispatch import dispatch_pending
from engine.broker.index import index_pending
from engine.cli import main
from engine.protocol.times import parse_time
from engine.store import schemas
from tests.helpers import dead_letter_received
from tests.test_cli import assert_one_line_error, mq


@pytest.fixture(autouse=True)
def _plain_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("COLUMNS", "MQ_STORE", "MQ_DEBUG"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def root(tmp_path: Path) -> str:
    return str(tmp_path / "mqdata")


def mq_json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    code = main([*argv, "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(captured.out)  # exactly one document: json.loads refuses anything more


def seeded(root: str, n: int = 4) -> Store:
    store = Store.open(root)
    Admin(store).create_topic("T", 2)
    with Producer(store) as producer:
        for i in range(n):
            producer.send(Message("T", f"body-{i}".encode(), tags="A", keys=[f"k{i}"]), queue_id=0)
    dispatch_pending(store)
    index_pending(store)
    return store


def dead_lettered(root: str) -> Store:
    store = seeded(root, 2)
    dead_letter_received(store, "T", "g")
    return store


# ----------------------------------------------------------------------------- --json everywhere
COMMANDS = [
    *(f"topic {a}" for a in ("create", "list", "stats", "update", "delete")),
    *(f"group {a}" for a in ("list", "progress", "reset", "config")),
    *(f"message {a}" for a in ("view", "query", "trace")),
    *(f"dlq {a}" for a in ("list", "resend")),
    *("send", "pull", "lag", "sql", "dispatch", "broker", "maintenance", "status", "dashboard", "serve"),
]


def test_every_command_takes_store_and_json() -> None:
    from engine.cli import build_parser

    parser = build_parser()
    leaves: list[Any] = []

    def walk(p: Any) -> None:
        subs = [a for a in p._actions if a.__class__.__name__ == "_SubParsersAction"]
        if not subs:
            leaves.append(p)
        for action in subs:
            for child in action.choices.values():
                walk(child)

    walk(parser)
    assert sorted(leaf.prog.removeprefix("mq ") for leaf in leaves) == sorted(COMMANDS)
    for leaf in leaves:
        options = {o for a in leaf._actions for o in a.option_strings}
        assert {"--store", "--json"} <= options, leaf.prog


def test_json_may_be_given_before_the_command(capsys: pytest.CaptureFixture[str], root: str) -> None:
    seeded(root)
    code = main(["--json", "--store", root, "topic", "list"])
    assert code == 0
    assert [t["name"] for t in json.loads(capsys.readouterr().out)] == ["T"]


def test_errors_with_json_are_still_one_line_on_stderr(capsys: pytest.CaptureFixture[str], root: str) -> None:
    code, out, err = mq(capsys, "topic", "stats", "Nope", "--json", "--store", root)
    assert_one_line_error(code, err, "Nope")
    assert out == ""


# ----------------------------------------------------------------------------- topic
def test_topic_update_expands_and_json_shows_the_new_count(
    capsys: pytest.CaptureFixture[str], root: str
) -> None:
    seeded(root)
    doc = mq_json(capsys, "topic", "update", "T", "--queues", "4", "--store", root)
    assert (doc["name"], doc["queues"]) == ("T", 4)
    stats = mq_json(capsys, "topic", "stats", "T", "--store", root)
    assert [(s["queue_id"], s["max_offset"]) for s in stats] == [(0, 4), (1, 0), (2, 0), (3, 0)]
    code, out, _ = mq(capsys, "topic", "update", "T", "--queues", "8", "--store", root)
    assert code == 0 and "8 queue(s)" in out


def test_topic_update_that_shrinks_is_one_line_error(capsys: pytest.CaptureFixture[str], root: str) -> None:
    seeded(root)
    code, _, err = mq(capsys, "topic", "update", "T", "--queues", "1", "--store", root)
    assert_one_line_error(code, err, "cannot shrink")


def test_topic_delete_refuses_while_consumed_then_forces(
    capsys: pytest.CaptureFixture[str], root: str
) -> None:
    store = seeded(root)
    PullConsumer(store, "billing").commit_offset("T", 0, 1)
    code, _, err = mq(capsys, "topic", "delete", "T", "--store", root)
    assert_one_line_error(code, err, "billing", "force")
    assert mq_json(capsys, "topic", "delete", "T", "--force", "--store", root) == {
        "deleted": "T",
        "queues": 2,
    }
    assert mq_json(capsys, "topic", "list", "--store", root) == []


def test_topic_create_list_and_stats_in_json(capsys: pytest.CaptureFixture[str], root: str) -> None:
    doc = mq_json(capsys, "topic", "create", "Orders", "--queues", "3", "--store", root)
    assert (doc["name"], doc["queues"], doc["type"]) == ("Orders", 3, "NORMAL")
    assert [t["name"] for t in mq_json(capsys, "topic", "list", "--store", root)] == ["Orders"]
    assert len(mq_json(capsys, "topic", "stats", "Orders", "--store", root)) == 3


# ----------------------------------------------------------------------------- group
def test_group_list_and_progress(capsys: pytest.CaptureFixture[str], root: str) -> None:
    store = seeded(root)
    PullConsumer(store, "billing").commit_offset("T", 0, 3)
    groups = mq_json(capsys, "group", "list", "--store", root)
    assert [(g["group"], g["topics"], g["lag"]) for g in groups] == [("billing", ["T"], 1)]
    rows = mq_json(capsys, "group", "progress", "billing", "--store", root)
    assert [(r["queue_id"], r["max_offset"], r["committed_offset"], r["lag"]) for r in rows] == [
        (0, 4, 3, 1),
        (1, 0, None, 0),
    ]
    assert rows[0]["last_consumed_ts_ms"] is not None
    code, out, _ = mq(capsys, "group", "progress", "billing", "--store", root)
    assert code == 0 and "billing: 1 message(s) behind" in out


def test_group_reset_by_offset_and_by_time(capsys: pytest.CaptureFixture[str], root: str) -> None:
    seeded(root)
    doc = mq_json(capsys, "group", "reset", "g", "T", "--queue-id", "0", "--offset", "2", "--store", root)
    assert doc == {"group": "g", "topic": "T", "offsets": {"0": 2}}
    assert PullConsumer(Store.open(root), "g").committed_offset("T", 0) == 2
    doc = mq_json(capsys, "group", "reset", "g", "T", "--timestamp", "0", "--store", root)
    assert doc["offsets"] == {"0": 0, "1": 0}
    doc = mq_json(capsys, "group", "reset", "g", "T", "--timestamp", "now", "--store", root)
    assert doc["offsets"] == {"0": 4, "1": 0}


def test_group_config_sets_and_shows_fifo(capsys: pytest.CaptureFixture[str], root: str) -> None:
    Store.open(root)
    assert mq_json(capsys, "group", "config", "g", "--store", root)["fifo"] is False
    assert mq_json(capsys, "group", "config", "g", "--fifo", "--store", root)["fifo"] is True
    assert mq_json(capsys, "group", "config", "g", "--store", root)["fifo"] is True
    assert Admin(Store.open(root)).group_config("g").fifo is True
    assert mq_json(capsys, "group", "config", "g", "--no-fifo", "--store", root)["fifo"] is False


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--queue-id", "0"], "--timestamp"),
        (["--timestamp", "0", "--offset", "1"], "--timestamp"),
        ([], "--timestamp"),
        (["--timestamp", "yesterday-ish"], "not a time"),
        (["--queue-id", "0", "--offset", "99"], "outside"),
    ],
)
def test_group_reset_bad_input_is_one_line_error(
    capsys: pytest.CaptureFixture[str], root: str, argv: list[str], fragment: str
) -> None:
    store = seeded(root)
    before = store.version(schemas.CONSUMER_OFFSET)
    code, _, err = mq(capsys, "group", "reset", "g", "T", *argv, "--store", root)
    assert_one_line_error(code, err, fragment)
    assert Store.open(root).version(schemas.CONSUMER_OFFSET) == before


def test_lag_in_json(capsys: pytest.CaptureFixture[str], root: str) -> None:
    store = seeded(root)
    PullConsumer(store, "billing").commit_offset("T", 0, 1)
    rows = mq_json(capsys, "lag", "--group", "billing", "--store", root)
    assert sum(r["lag"] for r in rows) == 3


# ----------------------------------------------------------------------------- message
def test_message_view_by_offset_id_and_by_uniq_key(capsys: pytest.CaptureFixture[str], root: str) -> None:
    seeded(root, 1)
    store = Store.open(root)
    [message] = PullConsumer(store, "x").pull("T", 0, 0).messages
    by_id = mq_json(capsys, "message", "view", message.msg_id, "--store", root)
    by_key = mq_json(capsys, "message", "view", message.uniq_key, "--store", root)
    assert by_id == by_key
    assert (by_id["body"], by_id["keys"], by_id["queue_offset"]) == ("body-0", ["k0"], 0)
    code, out, _ = mq(capsys, "message", "view", message.msg_id, "--store", root)
    assert code == 0 and "body-0" in out and message.uniq_key in out


def test_message_view_of_binary_body_is_base64_in_json(capsys: pytest.CaptureFixture[str], root: str) -> None:
    store = Store.open(root)
    Admin(store).create_topic("T", 1)
    with Producer(store) as producer:
        sent = producer.send(Message("T", b"\xff\x00\xfe"))
    assert mq_json(capsys, "message", "view", sent.msg_id, "--store", root)["body"] == {"base64": "/wD+"}


def test_message_body_with_markup_is_printed_as_text(capsys: pytest.CaptureFixture[str], root: str) -> None:
    store = Store.open(root)
    Admin(store).create_topic("T", 1)
    with Producer(store) as producer:
        sent = producer.send(Message("T", b"[bold]x[/] <script>alert(1)</script> [/unclosed]"))
    code, out, _ = mq(capsys, "message", "view", sent.msg_id, "--store", root)
    assert code == 0
    assert "[bold]x[/] <script>alert(1)</script> [/unclosed]" in out


def test_message_query_by_key(capsys: pytest.CaptureFixture[str], root: str) -> None:
    seeded(root)
    found = mq_json(capsys, "message", "query", "T", "--key", "k2", "--store", root)
    assert [m["body"] for m in found] == ["body-2"]
    assert mq_json(capsys, "message", "query", "T", "--key", "k2", "--end", "0", "--store", root) == []
    code, out, _ = mq(capsys, "message", "query", "T", "--key", "k2", "--begin", "now-1h", "--store", root)
    assert code == 0 and "1 message(s) of T with key k2" in out


def test_message_trace_tells_the_story(capsys: pytest.CaptureFixture[str], root: str) -> None:
    store = dead_lettered(root)
    [dead] = Admin(store).dlq_messages("g", 1)
    doc = mq_json(capsys, "message", "trace", dead.uniq_key, "--store", root)
    kinds = [e["kind"] for e in doc["events"]]
    assert kinds[0] == "STORED" and "PULLED" in kinds and "NACKED" in kinds and "DEAD_LETTERED" in kinds
    code, out, _ = mq(capsys, "message", "trace", dead.msg_id, "--store", root)
    assert code == 0 and "DEAD_LETTERED" in out and "%DLQ%g" in out


def test_message_query_by_time_window(capsys: pytest.CaptureFixture[str], root: str) -> None:
    store = seeded(root)
    messages = PullConsumer(store, "x").pull("T", 0, 0).messages
    begin, end = messages[2].store_ts_ms, messages[3].store_ts_ms + 1
    found = mq_json(capsys, "message", "query", "T", "--begin", str(begin), "--store", root)
    assert [m["body"] for m in found] == [m.body.decode() for m in messages if m.store_ts_ms >= begin]
    window = ["--begin", "0", "--end", str(end), "--max", "2"]
    found = mq_json(capsys, "message", "query", "T", *window, "--store", root)
    assert [m["body"] for m in found] == ["body-0", "body-1"]  # the oldest two of the window


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["message", "view", "0" * 32], "no message"),
        (["message", "trace", "nope"], "no message"),
        (["message", "query", "Nope", "--key", "k"], "does not exist"),
        (["message", "query", "T", "--key", "k", "--begin", "5", "--end", "1"], "after"),
        (["message", "query", "T", "--max", "5000"], "max_num"),
    ],
)
def test_message_bad_input_is_one_line_error(
    capsys: pytest.CaptureFixture[str], root: str, argv: list[str], fragment: str
) -> None:
    seeded(root, 1)
    code, _, err = mq(capsys, *argv, "--store", root)
    assert_one_line_error(code, err, fragment)


# ----------------------------------------------------------------------------- dlq
def test_dlq_list_and_resend_one(capsys: pytest.CaptureFixture[str], root: str) -> None:
    dead_lettered(root)
    listed = mq_json(capsys, "dlq", "list", "g", "--store", root)
    assert sorted(m["body"] for m in listed) == ["body-0", "body-1"]
    sent = mq_json(capsys, "dlq", "resend", "g", listed[0]["msg_id"], "--store", root)
    assert [(r["dlq_msg_id"], r["sent"]["topic"]) for r in sent] == [(listed[0]["msg_id"], "T")]
    assert Admin(Store.open(root)).topic_stats("T")[0].max_offset == 3  # in the queue's tail at once
    assert dispatch_pending(Store.open(root)) == 1
    assert Admin(Store.open(root)).topic_stats("T")[0].max_offset == 3


def test_dlq_resend_all(capsys: pytest.CaptureFixture[str], root: str) -> None:
    dead_lettered(root)
    listed = mq_json(capsys, "dlq", "list", "g", "--store", root)
    sent = mq_json(capsys, "dlq", "resend", "g", "--all", "--store", root)
    assert len(sent) == 2
    assert sorted(r["sent"]["msg_id"] for r in sent) == sorted(m["msg_id"] for m in listed)  # ids kept
    code, out, _ = mq(capsys, "dlq", "list", "g", "--store", root)
    assert code == 0 and "2 dead letter(s) of group g" in out


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["dlq", "resend", "g"], "--all"),
        (["dlq", "resend", "g", "X", "--all"], "--all"),
        (["dlq", "resend", "g", "NOPE"], "not in the dead-letter queue"),
        (["dlq", "list", "bad group!"], "group"),
    ],
)
def test_dlq_bad_input_is_one_line_error(
    capsys: pytest.CaptureFixture[str], root: str, argv: list[str], fragment: str
) -> None:
    dead_lettered(root)
    code, _, err = mq(capsys, *argv, "--store", root)
    assert_one_line_error(code, err, fragment)


# ----------------------------------------------------------------------------- send, pull, status, jobs
def test_send_and_pull_in_json(capsys: pytest.CaptureFixture[str], root: str) -> None:
    Admin(Store.open(root)).create_topic("T", 1)
    sent = mq_json(capsys, "send", "T", "hello", "--keys", "a", "b", "--store", root)
    assert (sent["status"], sent["queue_offset"]) == ("SEND_OK", 0)
    assert mq_json(capsys, "dispatch", "--once", "--no-spark", "--store", root) == {
        "dispatched": 1,
        "spark": False,
    }
    pulled = mq_json(capsys, "pull", "T", "--queue-id", "0", "--offset", "0", "--commit", "--store", root)
    assert pulled["result"]["status"] == "FOUND"
    assert [m["body"] for m in pulled["result"]["messages"]] == ["hello"]
    assert pulled["committed_offset"] == 1


def test_status_in_json(capsys: pytest.CaptureFixture[str], root: str) -> None:
    seeded(root)
    doc = mq_json(capsys, "status", "--store", root)
    assert doc["jobs"] == []
    assert {t["table"] for t in doc["tables"]} >= {"commit_log", "consume_queue"}


def test_maintenance_once_runs_without_spark_and_reports_json(
    capsys: pytest.CaptureFixture[str], root: str
) -> None:
    seeded(root)
    doc = mq_json(capsys, "maintenance", "--store", root, "--once")
    assert doc["job"] == "maintenance" and doc["exit_code"] == 0


def test_broker_with_an_unknown_job_is_an_error_before_spark(
    capsys: pytest.CaptureFixture[str], root: str
) -> None:
    code, out, err = mq(capsys, "broker", "--store", root, "--once", "--jobs", "nope")
    assert code == 2 and out == ""
    assert "nope" in err and "Traceback" not in err


# ----------------------------------------------------------------------------- times
@pytest.mark.parametrize(
    ("text", "expected"),
    [("1700000000000", 1_700_000_000_000), ("now", 10_000_000), ("now-30m", 10_000_000 - 1_800_000)],
)
def test_parse_time_accepts_ms_now_and_relative(text: str, expected: int) -> None:
    assert parse_time(text, now_ms=10_000_000) == expected


def test_parse_time_accepts_iso_with_an_offset() -> None:
    assert parse_time("2023-11-14T22:13:20+00:00") == 1_700_000_000_000


# ----------------------------------------------------------------------------- sql: queries only
@pytest.mark.spark
@pytest.mark.parametrize(
    "statement",
    [
        "DELETE FROM commit_log",
        "INSERT INTO commit_log SELECT * FROM commit_log",
        "UPDATE commit_log SET tags = 'x'",
        "CREATE TABLE stolen AS SELECT * FROM messages",
        "DROP VIEW messages",
        "SET spark.sql.shuffle.partitions = 7",
        "WITH m AS (SELECT * FROM commit_log) INSERT INTO commit_log SELECT * FROM m",
        "BEGIN DELETE FROM commit_log; END",
        "SELECT 1; DELETE FROM commit_log",
    ],
)
def test_sql_refuses_anything_but_a_query(
    capsys: pytest.CaptureFixture[str], root: str, spark: Any, statement: str
) -> None:
    store = seeded(root)
    versions = {t: store.version(t) for t in (schemas.COMMIT_LOG, schemas.CONSUME_QUEUE)}
    partitions = spark.conf.get("spark.sql.shuffle.partitions")
    code, out, err = mq(capsys, "sql", statement, "--store", root)
    assert_one_line_error(code, err)
    assert "queries only" in err or "SQL failed" in err
    assert out == ""
    reopened = Store.open(root)
    assert {t: reopened.version(t) for t in versions} == versions
    assert spark.conf.get("spark.sql.shuffle.partitions") == partitions


@pytest.mark.spark
def test_sql_json_is_one_document_of_rows(capsys: pytest.CaptureFixture[str], root: str, spark: Any) -> None:
    seeded(root)
    query = "WITH m AS (SELECT * FROM messages) SELECT queue_id, count(*) AS n FROM m GROUP BY queue_id"
    doc = mq_json(capsys, "sql", query, "--store", root)
    assert doc == {"columns": ["queue_id", "n"], "rows": [{"queue_id": 0, "n": 4}], "more": False}


# ----------------------------------------------------------------------------- progress
def test_progress_shows_on_a_terminal_and_stays_off_stdout() -> None:
    import io

    from rich.console import Console

    from engine.cli.common import Output

    out_text, err_text = io.StringIO(), io.StringIO()
    out = Output(Console(file=out_text), Console(file=err_text, force_terminal=True, width=100), as_json=True)
    with out.bar() as bar:
        task = bar.add_task("resending dead letters", total=2)
        bar.advance(task)
        bar.refresh()
    with out.progress("reading the logs"):
        pass
    out.emit({"done": True})
    assert "resending dead letters" in err_text.getvalue()
    assert json.loads(out_text.getvalue()) == {"done": True}


def test_progress_is_silent_when_stderr_is_not_a_terminal() -> None:
    import io

    from rich.console import Console

    from engine.cli.common import Output

    err_text = io.StringIO()
    out = Output(Console(file=io.StringIO()), Console(file=err_text), as_json=False)
    with out.bar() as bar:
        bar.advance(bar.add_task("resending", total=1))
    with out.progress("reading"):
        pass
    assert err_text.getvalue() == ""
