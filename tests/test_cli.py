"""The ``mq`` command line: every subcommand on a store in tmp_path, through ``engine.cli.main``."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from engine import Admin, Message, Producer, PullConsumer, Store
from engine.broker.dispatch import dispatch_pending
from engine.cli import JAVA_MESSAGE, main
from engine.protocol import select_queue_by_hash
from tests.helpers import commit_log_rows


@pytest.fixture(autouse=True)
def _plain_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("MQ_STORE", raising=False)
    monkeypatch.delenv("MQ_DEBUG", raising=False)


@pytest.fixture
def root(tmp_path: Path) -> str:
    return str(tmp_path / "mqdata")


def mq(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line_error(code: int, err: str, *fragments: str) -> None:
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("mq: error: ")
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0]


def seed(root: str, topic: str = "T", queues: int = 2) -> Store:
    store = Store.open(root)
    Admin(store).create_topic(topic, queues)
    with Producer(store) as producer:
        for i in range(6):
            producer.send(Message(topic, f"body-{i}".encode(), tags="TagA" if i % 2 == 0 else "TagB"), 0)
    dispatch_pending(store)
    return store


# ----------------------------------------------------------------------------- topic
def test_topic_create_then_list_shows_it(capsys: pytest.CaptureFixture[str], root: str) -> None:
    code, out, _ = mq(capsys, "topic", "create", "Orders", "--queues", "3", "--store", root)
    assert code == 0
    assert "Orders" in out and "3 queue(s)" in out
    code, out, _ = mq(capsys, "topic", "list", "--store", root)
    assert code == 0
    assert re.search(r"Orders\s*│\s*3\s*│\s*NORMAL", out), out
    assert Admin(Store.open(root)).topics()[0].queues == 3


def test_topic_create_twice_with_same_settings_is_idempotent(
    capsys: pytest.CaptureFixture[str], root: str
) -> None:
    assert mq(capsys, "topic", "create", "Orders", "--store", root)[0] == 0
    code, out, _ = mq(capsys, "topic", "create", "Orders", "--store", root)
    assert code == 0
    assert "4 queue(s)" in out


def test_topic_create_with_other_settings_is_one_line_error(
    capsys: pytest.CaptureFixture[str], root: str
) -> None:
    mq(capsys, "topic", "create", "Orders", "--queues", "2", "--store", root)
    code, _, err = mq(capsys, "topic", "create", "Orders", "--queues", "8", "--store", root)
    assert_one_line_error(code, err, "Orders", "exists")


def test_topic_create_with_bad_name_is_one_line_error(capsys: pytest.CaptureFixture[str], root: str) -> None:
    code, _, err = mq(capsys, "topic", "create", "bad name!", "--store", root)
    assert_one_line_error(code, err)


def test_topic_list_hides_system_topics_unless_all(capsys: pytest.CaptureFixture[str], root: str) -> None:
    store = Store.open(root)
    Admin(store).ensure_schedule_topic()
    Admin(store).create_topic("Mine")
    _, out, _ = mq(capsys, "topic", "list", "--store", root)
    assert "Mine" in out and "SCHEDULE_TOPIC_XXXX" not in out
    _, out, _ = mq(capsys, "topic", "list", "--all", "--store", root)
    assert "SCHEDULE_TOPIC_XXXX" in out


def test_topic_stats_counts_dispatched_messages_per_queue(
    capsys: pytest.CaptureFixture[str], root: str
) -> None:
    seed(root)
    code, out, _ = mq(capsys, "topic", "stats", "T", "--store", root)
    assert code == 0
    assert "T: 6 dispatched message(s)" in out
    rows = [line for line in out.splitlines() if re.match(r"^│\s+\d", line)]
    assert [re.findall(r"\d+", r)[:4] for r in rows] == [["0", "0", "6", "6"], ["1", "0", "0", "0"]]


def test_topic_stats_of_unknown_topic_is_one_line_error(
    capsys: pytest.CaptureFixture[str], root: str
) -> None:
    code, out, err = mq(capsys, "topic", "stats", "Nope", "--store", root)
    assert_one_line_error(code, err, "'Nope' does not exist")
    assert out == ""


# ----------------------------------------------------------------------------- send
def test_send_prints_msg_id_queue_and_offsets(capsys: pytest.CaptureFixture[str], root: str) -> None:
    Admin(Store.open(root)).create_topic("T", 4)
    code, out, _ = mq(capsys, "send", "T", "hello", "--tags", "TagA", "--queue-id", "2", "--store", root)
    assert code == 0
    msg_id = re.search(r"msg id\s+([0-9A-F]{32})", out)
    assert msg_id is not None
    assert re.search(r"queue id\s+2\b", out)
    assert re.search(r"queue offset\s+0\b", out)
    assert re.search(r"physical offset\s+0\b", out)
    (row,) = commit_log_rows(Store.open(root))
    assert row["uniq_key"] == msg_id.group(1)  # RocketMQ's getMsgId(): the client unique id
    assert re.search(rf"offset msg id\s+{row['msg_id']}", out)
    assert row["body"] == b"hello" and row["tags"] == "TagA" and row["queue_id"] == 2


def test_send_stores_keys_and_properties(capsys: pytest.CaptureFixture[str], root: str) -> None:
    Admin(Store.open(root)).create_topic("T")
    argv = ["send", "T", "x", "--keys", "k1", "k2", "--property", "a=1", "b=x=y", "--store", root]
    assert mq(capsys, *argv)[0] == 0
    (row,) = commit_log_rows(Store.open(root))
    assert row["keys"] == ["k1", "k2"]
    props = dict(row["properties"])  # type: ignore[call-overload]
    assert props["a"] == "1" and props["b"] == "x=y"


def test_send_with_sharding_key_uses_the_hash_queue(capsys: pytest.CaptureFixture[str], root: str) -> None:
    Admin(Store.open(root)).create_topic("T", 8)
    for _ in range(3):
        assert mq(capsys, "send", "T", "x", "--sharding-key", "order-42", "--store", root)[0] == 0
    queues = {row["queue_id"] for row in commit_log_rows(Store.open(root))}
    assert queues == {select_queue_by_hash("order-42", 8)}


def test_send_to_unknown_topic_is_one_line_error_and_writes_nothing(
    capsys: pytest.CaptureFixture[str], root: str
) -> None:
    code, _, err = mq(capsys, "send", "Nope", "x", "--store", root)
    assert_one_line_error(code, err, "'Nope' does not exist")
    assert commit_log_rows(Store.open(root)) == []


def test_send_with_malformed_property_is_one_line_error(
    capsys: pytest.CaptureFixture[str], root: str
) -> None:
    Admin(Store.open(root)).create_topic("T")
    code, _, err = mq(capsys, "send", "T", "x", "--property", "novalue", "--store", root)
    assert_one_line_error(code, err, "key=value")
    assert commit_log_rows(Store.open(root)) == []


def test_send_with_queue_out_of_range_is_one_line_error(
    capsys: pytest.CaptureFixture[str], root: str
) -> None:
    Admin(Store.open(root)).create_topic("T", 2)
    code, _, err = mq(capsys, "send", "T", "x", "--queue-id", "5", "--store", root)
    assert_one_line_error(code, err, "queue_id 5")


# ----------------------------------------------------------------------------- pull
def test_pull_after_dispatch_shows_status_next_offset_and_messages(
    capsys: pytest.CaptureFixture[str], root: str
) -> None:
    seed(root)
    code, out, _ = mq(capsys, "pull", "T", "--queue-id", "0", "--offset", "0", "--max", "4", "--store", root)
    assert code == 0
    assert out.startswith("FOUND  next offset 4")
    assert all(f"body-{i}" in out for i in range(4)) and "body-4" not in out


def test_pull_with_expression_returns_only_matching_tags(
    capsys: pytest.CaptureFixture[str], root: str
) -> None:
    seed(root)
    argv = ["pull", "T", "--queue-id", "0", "--offset", "0", "--expression", "TagB", "--store", root]
    code, out, _ = mq(capsys, *argv)
    assert code == 0
    assert "FOUND" in out
    assert "body-1" in out and "body-3" in out and "body-5" in out
    assert "body-0" not in out and "TagA" not in out


def test_pull_before_dispatch_finds_the_message(capsys: pytest.CaptureFixture[str], root: str) -> None:
    store = Store.open(root)
    Admin(store).create_topic("T", 1)
    Producer(store).send(Message("T", b"x"))
    code, out, _ = mq(capsys, "pull", "T", "--queue-id", "0", "--offset", "0", "--store", root)
    assert code == 0
    assert out.startswith("FOUND  next offset 1  (queue min 0, max 1)  1 message(s)")
    code, out, _ = mq(capsys, "pull", "T", "--queue-id", "0", "--offset", "1", "--store", root)
    assert code == 0 and out.startswith("NO_NEW_MSG  next offset 1")


@pytest.mark.parametrize(
    ("options", "first_words"),
    [
        pytest.param(
            ["--offset", "99"],
            "OFFSET_ILLEGAL  next offset 6",
            id="past-max-offset-is-offset-illegal-with-correction",
        ),
        pytest.param(
            ["--offset", "6", "--suspend-ms", "100"],
            "NO_NEW_MSG",
            id="with-suspend-waits-and-returns-no-new-msg",
        ),
    ],
)
def test_pull_at_or_past_the_end_says_why_nothing_came_and_where_to_go_on(
    capsys: pytest.CaptureFixture[str], root: str, options: list[str], first_words: str
) -> None:
    seed(root)
    code, out, _ = mq(capsys, "pull", "T", "--queue-id", "0", *options, "--store", root)
    assert code == 0
    assert out.startswith(first_words)


def test_pull_with_commit_records_the_groups_offset(capsys: pytest.CaptureFixture[str], root: str) -> None:
    store = seed(root)
    argv = ["pull", "T", "--queue-id", "0", "--offset", "0", "--max", "2", "--group", "G1", "--commit"]
    code, out, _ = mq(capsys, *argv, "--store", root)
    assert code == 0
    assert "committed offset 2 for group G1" in out
    assert PullConsumer(store, "G1").committed_offset("T", 0) == 2


def test_pull_of_unknown_topic_is_one_line_error(capsys: pytest.CaptureFixture[str], root: str) -> None:
    code, _, err = mq(capsys, "pull", "Nope", "--queue-id", "0", "--offset", "0", "--store", root)
    assert_one_line_error(code, err, "'Nope' does not exist")


def test_pull_with_bad_expression_is_one_line_error(capsys: pytest.CaptureFixture[str], root: str) -> None:
    seed(root)
    argv = ["pull", "T", "--queue-id", "0", "--offset", "0", "--expression", "TagA ||", "--store", root]
    code, _, err = mq(capsys, *argv)
    assert_one_line_error(code, err, "empty tag")


# ----------------------------------------------------------------------------- arguments, store
def test_missing_required_argument_is_one_line_error(capsys: pytest.CaptureFixture[str], root: str) -> None:
    code, out, err = mq(capsys, "pull", "T", "--offset", "0", "--store", root)
    assert_one_line_error(code, err, "--queue-id")
    assert out == ""


def test_non_integer_argument_is_one_line_error(capsys: pytest.CaptureFixture[str], root: str) -> None:
    code, _, err = mq(capsys, "topic", "create", "T", "--queues", "many", "--store", root)
    assert_one_line_error(code, err, "'many' is not an integer")


def test_no_command_is_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = mq(capsys)
    assert_one_line_error(code, err, "COMMAND")


def test_unknown_command_is_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = mq(capsys, "frobnicate")
    assert_one_line_error(code, err, "frobnicate")


def test_help_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = mq(capsys, "--help")
    assert code == 0
    assert "topic" in out and "send" in out and "pull" in out and "sql" in out and "dispatch" in out


def test_store_defaults_to_mq_store_env(
    capsys: pytest.CaptureFixture[str], root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MQ_STORE", root)
    assert mq(capsys, "topic", "create", "FromEnv")[0] == 0
    assert [t.name for t in Admin(Store.open(root)).topics()] == ["FromEnv"]


def test_store_may_be_given_before_the_command(capsys: pytest.CaptureFixture[str], root: str) -> None:
    assert mq(capsys, "--store", root, "topic", "create", "Early")[0] == 0
    assert [t.name for t in Admin(Store.open(root)).topics()] == ["Early"]


def test_store_that_is_a_file_is_one_line_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a store")
    code, _, err = mq(capsys, "topic", "list", "--store", str(blocker))
    assert_one_line_error(code, err)


# ----------------------------------------------------------------------------- dispatch
def test_dispatch_without_spark_makes_sent_messages_pullable(
    capsys: pytest.CaptureFixture[str], root: str
) -> None:
    store = Store.open(root)
    Admin(store).create_topic("T", 1)
    Producer(store).send_batch([Message("T", b"a"), Message("T", b"b")])
    code, out, _ = mq(capsys, "dispatch", "--once", "--no-spark", "--store", root)
    assert code == 0
    assert "dispatched 2 entries" in out
    assert PullConsumer(store, "G").max_offset("T", 0) == 2


def test_dispatch_no_spark_needs_once(capsys: pytest.CaptureFixture[str], root: str) -> None:
    code, _, err = mq(capsys, "dispatch", "--no-spark", "--store", root)
    assert_one_line_error(code, err, "--once")


@pytest.mark.parametrize("argv", [["sql", "SELECT 1"], ["dispatch", "--once"]])
def test_spark_commands_without_java_are_one_line_error(
    capsys: pytest.CaptureFixture[str], root: str, monkeypatch: pytest.MonkeyPatch, argv: list[str]
) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", "")
    code, _, err = mq(capsys, *argv, "--store", root)
    assert_one_line_error(code, err, JAVA_MESSAGE)


# ----------------------------------------------------------------------------- the program
def run_program(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "engine.cli", *argv], capture_output=True, text=True, timeout=120, check=False
    )


def test_program_exits_zero_and_prints_the_table(root: str) -> None:
    Admin(Store.open(root)).create_topic("T")
    done = run_program("topic", "list", "--store", root)
    assert done.returncode == 0, done.stderr
    assert "T" in done.stdout


def test_program_error_is_one_line_on_stderr_exit_two(root: str) -> None:
    done = run_program("topic", "stats", "Nope", "--store", root)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "mq: error: topic 'Nope' does not exist; create it with Admin.create_topic"
    ]


# ----------------------------------------------------------------------------- sql
@pytest.mark.spark
def test_sql_prints_rows_over_the_messages_view(
    capsys: pytest.CaptureFixture[str], root: str, spark: Any
) -> None:
    seed(root)
    query = "SELECT tags, count(*) AS n FROM messages WHERE topic = 'T' GROUP BY tags ORDER BY tags"
    code, out, _ = mq(capsys, "sql", query, "--store", root)
    assert code == 0
    assert "2 row(s)" in out
    assert re.search(r"TagA\s*│\s*3", out) and re.search(r"TagB\s*│\s*3", out), out
    assert spark.sql("SELECT 1 AS one").collect()[0]["one"] == 1  # the shared session is still up


@pytest.mark.spark
def test_sql_limit_caps_the_rows_shown(capsys: pytest.CaptureFixture[str], root: str, spark: Any) -> None:
    seed(root)
    code, out, _ = mq(capsys, "sql", "SELECT body FROM messages", "--limit", "2", "--store", root)
    assert code == 0
    assert "2 row(s); more not shown" in out
    assert "body-" in out  # binary bodies shown as text


@pytest.mark.spark
def test_sql_error_is_one_line(capsys: pytest.CaptureFixture[str], root: str, spark: Any) -> None:
    code, _, err = mq(capsys, "sql", "SELEC nonsense", "--store", root)
    assert_one_line_error(code, err, "SQL failed", "PARSE_SYNTAX_ERROR")
