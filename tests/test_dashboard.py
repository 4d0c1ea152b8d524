"""``mq dashboard`` end to end: a real server on a free loopback port, real pages in headless
Chromium (Debian's ``chromium``, driven by playwright without any browser download), checked for
what a person would see: topics, a group's lag, a found message and its trace, an escaped body, a
resend that lands only with the token."""

from __future__ import annotations

import json
import os
import shutil
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from engine import Admin, Message, Producer, PullConsumer, Store
from engine.broker.dispatch import dispatch_pending
from engine.broker.index import index_pending
from engine.cli import build_parser
from engine.dashboard.app import lag_chart
from engine.dashboard.server import bind, make_server
from tests.helpers import dead_letter_received

CHROMIUM = os.environ.get("MQ_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--no-first-run",
]
EVIL = b"<script>window.pwned = 1</script><img src=x onerror='window.pwned = 2'>"


@dataclass
class Running:
    url: str
    token: str
    store: Store
    board: Any
    sent: dict[str, Any]


def _seed(store: Store) -> dict[str, Any]:
    admin = Admin(store)
    admin.create_topic("Orders", 2)
    sent: dict[str, Any] = {}
    with Producer(store) as producer:
        for i in range(5):
            producer.send(
                Message("Orders", f"order {i}".encode(), tags="Created", keys=[f"order-{i}"]), queue_id=0
            )
        sent["evil"] = producer.send(
            Message("Orders", EVIL, keys=["evil"], properties={"note": "<b>bold?</b>"}), queue_id=1
        )
    dispatch_pending(store)
    index_pending(store)
    PullConsumer(store, "billing").commit_offset("Orders", 0, 2)  # 3 behind on queue 0
    dead_letter_received(store, "Orders", "failing", max_nums=1)
    return sent


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    store = Store.open(str(tmp_path_factory.mktemp("dash") / "mq"))
    sent = _seed(store)
    sock = bind("127.0.0.1", 0)
    server, token = make_server(store, sock)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        assert thread.is_alive(), "the dashboard server did not start"
        threading.Event().wait(0.05)
    board = server.config.app.state.dashboard
    try:
        yield Running(f"http://127.0.0.1:{sock.getsockname()[1]}", token, store, board, sent)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), (
        f"headless tests need Debian's chromium at {CHROMIUM} (.ci/run installs it)"
    )
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("profile")),
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_FLAGS,
            viewport={"width": 1280, "height": 800},
        )
        try:
            yield context.new_page()
        finally:
            context.close()


def test_the_dashboard_binds_to_loopback_by_default() -> None:
    args = build_parser().parse_args(["dashboard"])
    assert args.host == "127.0.0.1"


def test_topics_page_shows_topics_and_counts(running: Running, page: Any) -> None:
    page.goto(running.url + "/")
    row = page.locator("#topics tr", has_text="Orders")
    assert row.locator("td").nth(1).inner_text() == "2"  # queues
    assert row.locator("td").nth(4).inner_text() == "6"  # dispatched messages
    assert "billing" in page.locator("#groups").inner_text()
    page.click("text=Orders")
    assert page.locator("#queues tr").count() == 3


def test_group_page_shows_lag_per_queue_and_a_lag_chart(running: Running, page: Any) -> None:
    running.board.sampler.sample()
    running.board.sampler.sample()
    page.goto(running.url + "/groups")
    page.click("#groups >> text=billing")
    assert page.locator("#total-lag").inner_text() == "4"  # 3 on queue 0, 1 on queue 1
    lags = page.locator("#progress td.lag").all_inner_texts()
    assert lags == ["3", "1"]
    assert page.locator("#lag-chart polyline").count() == 1
    assert "top of the chart: 4 message(s) behind" in page.inner_text("main")


def test_a_message_found_by_id_shows_its_body_as_text_and_its_trace(running: Running, page: Any) -> None:
    evil = running.sent["evil"]
    page.goto(running.url + "/messages")
    page.fill("#by-id input[name=id]", evil.msg_id)  # the unique id (SendResult.msg_id)
    page.click("#by-id button")
    assert page.locator("#found tr").count() == 2
    page.click(f"#found >> text={evil.msg_id}")  # listed by the id the producer got
    assert evil.offset_msg_id in page.inner_text("#message")
    assert page.locator("#body").inner_text() == EVIL.decode()
    assert page.locator("#message tr", has_text="property note").locator("td").inner_text() == "<b>bold?</b>"
    assert page.evaluate("window.pwned") is None  # the body never ran as markup
    assert page.locator("#message b").count() == 0
    events = page.locator("#trace td.event").all_inner_texts()
    assert events[:2] == ["STORED", "DISPATCHED"]


def test_messages_found_by_key(running: Running, page: Any) -> None:
    page.goto(running.url + "/messages?topic=Orders&key=order-3")
    rows = page.locator("#found tr")
    assert rows.count() == 2
    assert "order 3" in rows.nth(1).inner_text()


def test_messages_found_by_time(running: Running, page: Any) -> None:
    page.goto(running.url + "/messages")
    page.fill("#by-key input[name=topic]", "Orders")
    page.fill("#by-key input[name=begin]", "0")
    page.click("#by-key button")
    bodies = page.locator("#found td.body").all_inner_texts()
    assert bodies[:5] == [f"order {i}" for i in range(5)]


def test_a_bad_search_is_an_error_page(running: Running, page: Any) -> None:
    response = page.goto(running.url + "/messages?id=nothing-like-this")
    assert response.status == 400
    assert "no message" in page.locator("#error").inner_text()
    assert page.goto(running.url + "/topics/Nope").status == 404


def test_resend_needs_the_token_then_lands(running: Running, page: Any) -> None:
    admin = Admin(running.store)
    before = admin.topic_stats("Orders")
    page.goto(running.url + "/dlq/failing")
    assert page.locator("#dead-letters tr").count() == 2
    page.click("#dead-letters form.resend button")  # no token
    assert "token" in page.locator("#error").inner_text()
    page.goto(running.url + "/dlq/failing")
    page.fill("#dead-letters input[name=token]", "wrong")
    page.click("#dead-letters form.resend button")
    assert "token" in page.locator("#error").inner_text()
    page.goto(running.url + "/dlq/failing")
    page.fill("#dead-letters input[name=token]", running.token)
    page.click("#dead-letters form.resend button")
    assert page.locator("#resent").inner_text().startswith("resent as ")
    new_id = page.locator("#resent a").inner_text()
    dispatch_pending(running.store)
    assert admin.find_message(new_id).topic == "Orders"
    after = admin.topic_stats("Orders")
    assert sum(s.max_offset for s in after) == sum(s.max_offset for s in before) + 1


def test_jobs_page_lists_the_tables(running: Running, page: Any, tmp_path: Path) -> None:
    page.goto(running.url + "/jobs")
    assert "commit_log" in page.locator("#tables").inner_text()
    shot = tmp_path / "jobs.png"
    page.screenshot(path=str(shot))
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_another_host_name_is_refused(running: Running) -> None:
    request = urllib.request.Request(running.url + "/", headers={"Host": "attacker.example"})
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=30)
    assert caught.value.code == 400


def test_lag_chart_scales_samples_into_the_box() -> None:
    assert lag_chart([(0, 5)]) == ""
    assert lag_chart([(0, 0), (10, 4), (20, 2)], width=100, height=40) == "0.0,40.0 50.0,0.0 100.0,20.0"


def test_mq_dashboard_prints_its_address_and_token_and_serves(tmp_path: Path) -> None:
    import re
    import subprocess
    import sys

    root = str(tmp_path / "mq")
    Admin(Store.open(root)).create_topic("Shown", 1)
    errors = tmp_path / "dashboard.err"
    with errors.open("w") as err:  # a file, not a pipe nobody reads: a full pipe blocks the server
        child = subprocess.Popen(
            [sys.executable, "-m", "engine.cli", "dashboard", "--port", "0", "--store", root],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    try:
        assert child.stdout is not None
        address = child.stdout.readline()
        token = child.stdout.readline()
        match = re.search(r"http://127\.0\.0\.1:(\d+)/", address)
        assert match, address + errors.read_text()[-3000:]
        assert re.fullmatch(r"resend token: \S{20,}\n", token)
        with urllib.request.urlopen(match.group(0), timeout=60) as response:
            assert "Shown" in response.read().decode()
    finally:
        child.terminate()
        child.wait(timeout=60)
    as_json = subprocess.Popen(
        [sys.executable, "-m", "engine.cli", "dashboard", "--port", "0", "--store", root, "--json"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert as_json.stdout is not None
        doc = json.loads(as_json.stdout.readline())
        assert doc["url"].startswith("http://127.0.0.1:") and len(doc["token"]) >= 20
    finally:
        as_json.terminate()
        as_json.wait(timeout=60)


def test_a_key_search_says_so_when_the_index_is_too_far_behind(
    running: Running, page: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from engine.client import queries

    Admin(running.store).create_topic("Audit", 1)
    with Producer(running.store) as producer:
        producer.send(Message("Audit", b"fresh", keys=["audit-1"]))
    dispatch_pending(running.store)
    page.goto(running.url + "/messages?topic=Audit&key=audit-1")  # found without the index job
    assert "fresh" in page.locator("#found").inner_text()
    assert page.locator("#incomplete").count() == 0
    monkeypatch.setattr(queries, "UNINDEXED_SCAN_VERSIONS", 0)
    page.goto(running.url + "/messages?topic=Audit&key=audit-1")
    assert "index is behind" in page.locator("#incomplete").inner_text()
