"""``mq dashboard`` over an ``s3a://`` store, in headless Chromium: the pages show the topics, a
group's lag, found messages and dead letters kept on S3, and no page, log line or process listing
shows the secret key (it travels in the environment; the rest with ``--storage-option``)."""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bench.seaweedfs import SeaweedS3
from engine import Store
from tests.test_dashboard import CHROMIUM, CHROMIUM_FLAGS, EVIL, _seed
from tests.test_serve_object_store import serve_command_options

pytestmark = [pytest.mark.s3]

REPO = Path(__file__).resolve().parent.parent


@dataclass
class Board:
    url: str
    store: Store
    sent: dict[str, Any]
    secret: str
    access_key: str
    log: Path
    pages: dict[str, str]  # path -> HTML seen, for the secret check


@pytest.fixture(scope="module")
def board(s3_server: SeaweedS3, s3_bucket: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Board]:
    options = s3_server.storage_options()
    root = f"s3a://{s3_bucket}/dash-{uuid.uuid4().hex[:8]}"
    store = Store.open(root, storage_options=options)
    sent = _seed(store)
    args, env = serve_command_options(options)
    log = tmp_path_factory.mktemp("dash-s3") / "dashboard.err"
    with log.open("w") as err, pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        child = subprocess.Popen(
            [sys.executable, "-m", "engine.cli", "dashboard", "--port", "0", "--store", root, *args],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    try:
        assert child.stdout is not None
        address, token = child.stdout.readline(), child.stdout.readline()
        match = re.search(r"http://127\.0\.0\.1:\d+", address)
        assert match, address + log.read_text()
        (log.parent / "dashboard.out").write_text(address + token)
        yield Board(
            match.group(0),
            store,
            sent,
            options["AWS_SECRET_ACCESS_KEY"],
            options["AWS_ACCESS_KEY_ID"],
            log,
            {},
        )
    finally:
        child.terminate()
        child.wait(timeout=60)


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A headless Chromium page (as ``tests/test_dashboard.py``'s)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("profile")),
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_FLAGS,
        )
        try:
            yield context.new_page()
        finally:
            context.close()


def _open(board: Board, page: Any, path: str) -> Any:
    response = page.goto(board.url + path)
    board.pages[path] = page.content()
    return response


def test_topics_page_lists_the_s3a_stores_topics(board: Board, page: Any) -> None:
    assert _open(board, page, "/").status == 200
    row = page.locator("#topics tr", has_text="Orders")
    assert row.locator("td").nth(1).inner_text() == "2"  # queues
    assert row.locator("td").nth(4).inner_text() == "6"  # dispatched messages
    assert "billing" in page.locator("#groups").inner_text()
    assert board.store.root in page.inner_text("body")
    _open(board, page, "/topics/Orders")
    assert page.locator("#queues tr").count() == 3


def test_group_page_shows_the_lag_read_from_s3(board: Board, page: Any) -> None:
    _open(board, page, "/groups")
    assert "billing" in page.locator("#groups").inner_text()
    _open(board, page, "/groups/billing")
    assert page.locator("#total-lag").inner_text() == "4"
    assert page.locator("#progress td.lag").all_inner_texts() == ["3", "1"]


def test_messages_are_found_by_key_and_id_with_their_body_and_trace(board: Board, page: Any) -> None:
    _open(board, page, "/messages?topic=Orders&key=order-3")
    assert "order 3" in page.locator("#found tr").nth(1).inner_text()
    evil = board.sent["evil"]
    _open(board, page, f"/messages/{evil.offset_msg_id}")
    assert page.locator("#body").inner_text() == EVIL.decode()
    assert page.evaluate("window.pwned") is None
    assert page.locator("#trace td.event").all_inner_texts()[:2] == ["STORED", "DISPATCHED"]


def test_dead_letters_and_jobs_pages_render(board: Board, page: Any) -> None:
    _open(board, page, "/dlq/failing")
    assert page.locator("#dead-letters tr").count() == 2
    _open(board, page, "/jobs")
    assert "commit_log" in page.locator("#tables").inner_text()


def test_no_page_and_no_output_shows_the_keys(board: Board, page: Any) -> None:
    for path in ("/", "/groups/billing", "/jobs", "/messages?topic=Orders&key=order-1", "/topics/Nope"):
        _open(board, page, path)
    assert len(board.pages) >= 5
    for path, html in board.pages.items():
        assert board.secret not in html, path
        assert board.access_key not in html, path
    output = board.log.read_text() + (board.log.parent / "dashboard.out").read_text()
    assert board.secret not in output and board.access_key not in output
    listing = subprocess.run(
        ["ps", "-eo", "args=", "--width", "100000"], capture_output=True, text=True
    ).stdout
    assert board.store.root in listing  # the dashboard is in the listing, without the secret
    assert board.secret not in listing
