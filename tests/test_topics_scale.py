"""Many topics: created in one commit, looked up incrementally, counted and listed cheaply."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
from starlette.requests import Request

from engine import (
    Admin,
    InvalidArgumentError,
    InvalidTopicError,
    Message,
    Producer,
    PullConsumer,
    Store,
    TopicExistsError,
)
from engine.broker.dispatch import dispatch_pending
from engine.cli import main as mq_main
from engine.dashboard.app import TOPICS_PER_PAGE, create_app
from engine.dashboard.sampler import Sampler
from engine.protocol.topics import TopicConfig
from engine.store import schemas
from engine.store import topics as topics_module
from engine.store.commit_markers import MARKS_KEY
from engine.store.topics import TopicCatalog
from tests.helpers import versions


def test_create_topics_creates_many_in_one_commit_and_is_idempotent(store: Store, admin: Admin) -> None:
    before = store.version(schemas.TOPICS)
    made = admin.create_topics([f"bulk-{i}" for i in range(50)], 3)
    assert store.version(schemas.TOPICS) == before + 1
    assert [c.name for c in made] == [f"bulk-{i}" for i in range(50)] and {c.queues for c in made} == {3}
    again = admin.create_topics(["bulk-7", "bulk-new"], 3)
    assert again[0] == made[7] and again[1].name == "bulk-new"
    assert store.version(schemas.TOPICS) == before + 2
    assert admin.create_topics(["bulk-1"], 3) == [made[1]]
    assert store.version(schemas.TOPICS) == before + 2  # nothing new: nothing written


@pytest.mark.parametrize(
    ("names", "queues", "error"),
    [
        (["ok", "bad name!"], 2, InvalidTopicError),
        (["ok", "SCHEDULE_TOPIC_XXXX"], 2, InvalidTopicError),
        (["ok", "ok"], 2, InvalidArgumentError),
        ("ok", 2, InvalidArgumentError),
        (["ok"], 0, InvalidArgumentError),
        (["ok", "exists"], 2, TopicExistsError),
    ],
)
def test_create_topics_with_any_bad_name_or_setting_writes_nothing(
    store: Store, admin: Admin, names: object, queues: int, error: type[Exception]
) -> None:
    admin.create_topic("exists", 1)
    before = versions(store)
    with pytest.raises(error):
        admin.create_topics(names, queues)  # type: ignore[arg-type]
    assert versions(store) == before
    assert "ok" not in store.topic_configs(refresh=True)


def test_a_catalog_follows_other_writers_commit_by_commit(store: Store, admin: Admin) -> None:
    other = Store.open(store.root)
    catalog = TopicCatalog(store)
    assert catalog.configs() == {}
    Admin(other).create_topics(["a", "b"], 2)
    seen = catalog.configs(refresh=True)
    assert sorted(seen) == ["a", "b"]
    Admin(other).update_topic("a", queues=5)
    Admin(other).delete_topic("b")
    Admin(other).create_topic("c", 1)
    after = catalog.configs(refresh=True)
    assert {n: c.queues for n, c in after.items()} == {"a": 5, "c": 1}
    assert sorted(seen) == ["a", "b"]  # a dictionary handed out is never changed afterwards
    assert TopicCatalog(store).configs() == after  # what a full read of the table folds to


@pytest.mark.parametrize("look", ["configs", "timed get"])
def test_a_look_up_does_not_wait_for_another_threads_commit_of_a_topic(
    store: Store, admin: Admin, monkeypatch: pytest.MonkeyPatch, look: str
) -> None:
    # A door's event loop looks topics up (every send, every pull), and once a second a look-up
    # checks the table for a newer version; a topic being created by another thread (a retry
    # topic, an auto-created one: seconds on a slow store) held them up to its commit.
    admin.create_topic("known", 1)
    catalog = TopicCatalog(store)
    assert catalog.get("known").queues == 1
    if look == "timed get":
        monkeypatch.setattr(topics_module, "ROUTE_REFRESH_S", 0.0)  # every look-up is due a check
    committing, release = threading.Event(), threading.Event()
    append = store.append

    def slow_append(name: str, rows: Any, **options: Any) -> int:
        if name == schemas.TOPICS:
            committing.set()
            release.wait(60)
        return append(name, rows, **options)

    def look_up() -> object:
        return sorted(catalog.configs()) if look == "configs" else catalog.get("known").queues

    monkeypatch.setattr(store, "append", slow_append)
    writer = threading.Thread(target=catalog.put, args=(TopicConfig("new", 2), 0))
    writer.start()
    try:
        assert committing.wait(30)
        looked: list[object] = []
        reader = threading.Thread(target=lambda: looked.append(look_up()))
        reader.start()
        reader.join(30)  # the commit is held until after this
        assert looked == [["known"] if look == "configs" else 1]  # from what is known, not after it
    finally:
        release.set()
        writer.join(30)
    assert sorted(catalog.configs()) == ["known", "new"]
    Admin(Store.open(store.root)).update_topic("known", queues=4)  # another process's commit
    if look == "timed get":
        assert catalog.get("known").queues == 4  # the next timed check (the lock free) finds it


def test_a_catalog_reads_the_whole_table_when_the_commits_since_its_version_are_gone(
    store: Store, admin: Admin
) -> None:
    catalog = TopicCatalog(store)
    admin.create_topic("first", 1)
    assert list(catalog.configs(refresh=True)) == ["first"]
    admin.create_topic("second", 1)
    log = Path(store.uri(schemas.TOPICS)) / "_delta_log"
    store.shared(schemas.TOPICS).checkpoint(cleanup=False)
    for path in log.glob("*.json"):
        path.unlink()  # as log cleanup does after a checkpoint
    assert sorted(catalog.configs(refresh=True)) == ["first", "second"]


def test_message_counts_are_the_dispatched_messages_of_every_topic(store: Store, admin: Admin) -> None:
    admin.create_topics(["x", "y", "z"], 2)
    with Producer(store) as producer:
        for i in range(5):
            producer.send(Message("x" if i < 3 else "y", b"m"), queue_id=i % 2)
    dispatch_pending(store)
    counts = admin.message_counts()
    assert counts == {"x": 3, "y": 2, "z": 0}
    assert counts == {
        t.name: sum(s.max_offset - s.min_offset for s in admin.topic_stats(t.name)) for t in admin.topics()
    }
    assert Sampler(admin, threading.Lock()).sample().topic_messages == counts


def test_the_dashboard_lists_topics_a_page_at_a_time(store: Store, admin: Admin) -> None:
    admin.create_topics([f"t{i:03d}" for i in range(TOPICS_PER_PAGE + 5)], 1)
    board = create_app(store, sample=False).state.dashboard

    def page(query: bytes) -> str:
        request = Request(
            {"type": "http", "method": "GET", "path": "/", "query_string": query, "headers": []}
        )
        return bytes(board.index(request).body).decode()

    first, second = page(b""), page(b"page=2")
    last_of_first, first_of_second = f"t{TOPICS_PER_PAGE - 1:03d}", f"t{TOPICS_PER_PAGE:03d}"
    assert "t000" in first and last_of_first in first and first_of_second not in first
    assert first_of_second in second and "t000<" not in second
    assert "page 2 of 2" in second and page(b"page=99") == second and page(b"page=x") == first


@pytest.mark.slow
def test_ten_thousand_topics_send_pull_dispatch_and_keep_commits_small(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "mqdata")
    admin = Admin(store)
    names = [f"topic-{i:05d}" for i in range(10_000)]
    for start in range(0, len(names), 2_000):
        admin.create_topics(names[start : start + 2_000], 4)
    assert len(admin.topics()) == 10_000
    with Producer(store) as producer:
        sent = [producer.send(Message(names[i * 97 % 10_000], b"%d" % i), queue_id=i % 4) for i in range(200)]
    assert [s.queue_offset for s in sent[:3]] == [0, 0, 0]
    log = Path(store.uri(schemas.COMMIT_LOG)) / "_delta_log"
    latest = store.version(schemas.COMMIT_LOG)
    info = json.loads((log / f"{latest:020d}.json").read_text().splitlines()[0])["commitInfo"]
    assert len(json.dumps(info)) <= 4096
    widest: dict[str, int] = {}
    for s in sent:
        widest[s.topic] = max(widest.get(s.topic, 0), s.queue_id + 1)
    assert json.loads(info[MARKS_KEY])["n"] == sum(widest.values())  # the queues written, not all 40,000
    assert dispatch_pending(store) == 200
    target = sent[-1]
    pulled = PullConsumer(store, "g").pull(target.topic, target.queue_id, target.queue_offset, 1)
    assert [m.body for m in pulled.messages] == [b"199"]
    assert sum(admin.message_counts().values()) == 200


def test_mq_topic_create_with_several_names_creates_them_in_one_commit(
    store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    before = store.version(schemas.TOPICS)
    assert (
        mq_main(["topic", "create", "A1", "A2", "A3", "--queues", "2", "--json", "--store", store.root]) == 0
    )
    doc = json.loads(capsys.readouterr().out)
    assert [(t["name"], t["queues"]) for t in doc] == [("A1", 2), ("A2", 2), ("A3", 2)]
    assert store.version(schemas.TOPICS) == before + 1
    assert mq_main(["topic", "create", "A1", "bad name!", "--store", store.root]) == 2
    assert "bad name!" not in store.topic_configs(refresh=True)
