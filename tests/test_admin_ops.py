"""Operating a store as RocketMQ's mqadmin does: topic update (queue expansion) and delete, groups
and their progress."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from engine import (
    Admin,
    InvalidArgumentError,
    InvalidTopicError,
    Message,
    Producer,
    PullConsumer,
    PullStatus,
    Store,
    TopicInUseError,
    TopicNotFoundError,
    TopicShrinkError,
)
from engine.broker.dispatch import dispatch_pending
from engine.client.membership import GroupMembership
from engine.store import schemas
from engine.store.topics import fold_topic_rows


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store.open(str(tmp_path / "mq"))


@pytest.fixture
def admin(store: Store) -> Admin:
    admin = Admin(store)
    admin.create_topic("T", 2)
    return admin


def send(store: Store, queue_id: int, n: int = 1, topic: str = "T") -> None:
    with Producer(store) as producer:
        for i in range(n):
            producer.send(Message(topic, f"m{i}".encode()), queue_id=queue_id)


# ----------------------------------------------------------------------------- update_topic
def test_update_topic_adds_queues_that_start_at_zero_and_keeps_existing_offsets(
    store: Store, admin: Admin
) -> None:
    send(store, 0, 3)
    dispatch_pending(store)
    assert admin.update_topic("T", queues=4).queues == 4
    send(store, 3, 2)
    dispatch_pending(store)
    stats = {s.queue_id: (s.min_offset, s.max_offset) for s in admin.topic_stats("T")}
    assert stats == {0: (0, 3), 1: (0, 0), 2: (0, 0), 3: (0, 2)}
    result = PullConsumer(store, "g").pull("T", 3, 0)
    assert result.status is PullStatus.FOUND
    assert [m.queue_offset for m in result.messages] == [0, 1]


def test_update_topic_is_seen_by_another_store_handle_without_reopening(store: Store, admin: Admin) -> None:
    other = Store.open(store.root)
    assert other.topic("T").queues == 2
    admin.update_topic("T", queues=3)
    assert other.topic_configs(refresh=True)["T"].queues == 3


def test_update_topic_keeps_the_creation_time(admin: Admin) -> None:
    created = admin.topics()[0].created_ts_ms
    assert admin.update_topic("T", queues=8).created_ts_ms == created


def test_update_topic_to_fewer_queues_is_refused_and_writes_nothing(store: Store, admin: Admin) -> None:
    before = store.version(schemas.TOPICS)
    with pytest.raises(TopicShrinkError, match="cannot shrink") as caught:
        admin.update_topic("T", queues=1)
    assert caught.value.queues == 2
    assert store.version(schemas.TOPICS) == before
    assert admin.topics()[0].queues == 2


def test_update_topic_with_the_same_settings_writes_nothing(store: Store, admin: Admin) -> None:
    before = store.version(schemas.TOPICS)
    assert admin.update_topic("T", queues=2).queues == 2
    assert store.version(schemas.TOPICS) == before


@pytest.mark.parametrize(
    ("name", "kwargs", "error"),
    [
        ("Nope", {"queues": 4}, TopicNotFoundError),
        ("bad name", {"queues": 4}, InvalidTopicError),
        ("%DLQ%g", {"queues": 4}, InvalidTopicError),
        ("T", {"queues": 5000}, InvalidArgumentError),
        ("T", {"queues": "8"}, InvalidArgumentError),
        ("T", {"perm": 3}, InvalidArgumentError),
    ],
)
def test_update_topic_bad_input_is_a_typed_error_and_writes_nothing(
    store: Store, admin: Admin, name: str, kwargs: dict[str, object], error: type[Exception]
) -> None:
    before = store.version(schemas.TOPICS)
    with pytest.raises(error):
        admin.update_topic(name, **kwargs)  # type: ignore[arg-type]
    assert store.version(schemas.TOPICS) == before


def test_racing_expansions_end_at_the_larger_count_never_a_shrink(store: Store, admin: Admin) -> None:
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def grow(n: int) -> None:
        try:
            barrier.wait()
            Admin(Store.open(store.root)).update_topic("T", queues=n)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=grow, args=(n,)) for n in (6, 8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # The expansion to 6 either raced the one to 8 (both read 4 queues; the catalog keeps the larger)
    # or read the topic after 8 had landed, which makes it a shrink and a typed refusal. Either way
    # the topic ends with 8 queues and nothing else fails.
    assert all(isinstance(exc, TopicShrinkError) and exc.requested == 6 for exc in errors), errors
    assert Store.open(store.root).topic_configs(refresh=True)["T"].queues == 8


def test_fold_topic_rows_takes_the_latest_row_and_never_lowers_queues() -> None:
    rows = [
        {"name": "A", "queues": 4, "perm": 6, "type": "NORMAL", "created_ts_ms": 10},
        {"name": "A", "queues": 2, "perm": 4, "type": "NORMAL", "created_ts_ms": 30},  # a stale racer
        {"name": "A", "queues": 8, "perm": 6, "type": "NORMAL", "created_ts_ms": 20},
        {"name": "B", "queues": 1, "perm": 6, "type": "NORMAL", "created_ts_ms": 5},
        {"name": "B", "queues": 0, "perm": 6, "type": "NORMAL", "created_ts_ms": 6},
    ]
    topics, stamps = fold_topic_rows(rows)
    assert list(topics) == ["A"]
    assert (topics["A"].queues, topics["A"].perm, topics["A"].created_ts_ms) == (8, 4, 10)
    assert stamps == {"A": 30, "B": 6}


# ----------------------------------------------------------------------------- delete_topic
def test_delete_topic_removes_it_from_routing(store: Store, admin: Admin) -> None:
    send(store, 0)
    admin.delete_topic("T")
    assert admin.topics() == []
    with pytest.raises(TopicNotFoundError):
        send(store, 0)


def test_delete_topic_refuses_while_a_group_is_behind_unless_forced(store: Store, admin: Admin) -> None:
    send(store, 0, 2)
    dispatch_pending(store)
    PullConsumer(store, "billing").commit_offset("T", 0, 1)
    before = store.version(schemas.TOPICS)
    with pytest.raises(TopicInUseError, match="billing") as caught:
        admin.delete_topic("T")
    assert caught.value.groups == ["billing"]
    assert store.version(schemas.TOPICS) == before
    assert admin.delete_topic("T", force=True).name == "T"
    assert admin.topics() == []


def test_delete_topic_refuses_while_a_live_member_subscribes(store: Store, admin: Admin) -> None:
    GroupMembership(store, "live", "c1").heartbeat({"T": "*"})
    with pytest.raises(TopicInUseError, match="live"):
        admin.delete_topic("T")


def test_delete_topic_is_allowed_once_every_group_is_done(store: Store, admin: Admin) -> None:
    send(store, 0, 2)
    dispatch_pending(store)
    PullConsumer(store, "done").commit_offset("T", 0, 2)
    admin.delete_topic("T")
    assert admin.topics() == []


def test_a_deleted_topic_can_be_created_again(admin: Admin) -> None:
    admin.delete_topic("T")
    assert admin.create_topic("T", 3).queues == 3
    assert [t.queues for t in admin.topics()] == [3]


@pytest.mark.parametrize(("name", "error"), [("Nope", TopicNotFoundError), ("%RETRY%g", InvalidTopicError)])
def test_delete_topic_bad_input_is_a_typed_error(admin: Admin, name: str, error: type[Exception]) -> None:
    with pytest.raises(error):
        admin.delete_topic(name)


# ----------------------------------------------------------------------------- groups
def test_groups_lists_every_group_the_logs_know(store: Store, admin: Admin) -> None:
    send(store, 0, 3)
    dispatch_pending(store)
    PullConsumer(store, "billing").commit_offset("T", 0, 1)
    GroupMembership(store, "live", "c1").heartbeat({"T": "*"})
    groups = {g.group: g for g in admin.groups()}
    assert sorted(groups) == ["billing", "live"]
    assert (groups["billing"].members, groups["billing"].topics, groups["billing"].lag) == (0, ("T",), 2)
    assert (groups["live"].members, groups["live"].topics, groups["live"].has_dlq) == (1, ("T",), False)


def test_group_progress_reports_each_queue(store: Store, admin: Admin) -> None:
    send(store, 0, 3)
    dispatch_pending(store)
    PullConsumer(store, "g").commit_offset("T", 0, 2)
    rows = admin.group_progress("g")
    assert [(r.queue_id, r.max_offset, r.committed_offset, r.lag) for r in rows] == [
        (0, 3, 2, 1),
        (1, 0, None, 0),
    ]
    second = PullConsumer(store, "x").pull("T", 0, 1).messages[0]
    assert rows[0].last_consumed_ts_ms == second.store_ts_ms
    assert rows[0].last_commit_ts_ms is not None and rows[1].last_consumed_ts_ms is None


def test_group_progress_of_a_group_without_offsets_is_empty(admin: Admin) -> None:
    assert admin.group_progress("never") == []


@pytest.mark.parametrize(("group", "topic"), [("bad group!", None), ("g", "Nope")])
def test_group_progress_bad_input_is_a_typed_error(admin: Admin, group: str, topic: str | None) -> None:
    with pytest.raises((InvalidArgumentError, TopicNotFoundError)):
        admin.group_progress(group, topic)


# ----------------------------------------------------------------------------- finding messages
def test_find_message_by_offset_id_or_uniq_key_even_before_indexing(store: Store, admin: Admin) -> None:
    with Producer(store) as producer:
        sent = producer.send(Message("T", b"x"), queue_id=1)
    by_id, by_key = admin.find_message(sent.msg_id), admin.find_message(sent.uniq_key)  # no index job ran
    assert by_id == by_key
    assert (by_id.topic, by_id.queue_id, by_id.body) == ("T", 1, b"x")


@pytest.mark.parametrize("msg_id", ["", "with space", None])
def test_find_message_refuses_a_malformed_id(admin: Admin, msg_id: object) -> None:
    with pytest.raises(InvalidArgumentError):
        admin.find_message(msg_id)  # type: ignore[arg-type]


def test_find_message_of_an_unknown_id_is_message_not_found(admin: Admin) -> None:
    from engine import MessageNotFoundError

    with pytest.raises(MessageNotFoundError):
        admin.find_message("0" * 32)


def test_query_by_time_returns_the_window_oldest_first_across_queues(store: Store, admin: Admin) -> None:
    send(store, 0, 3)
    send(store, 1, 2)
    dispatch_pending(store)
    everything = admin.query_by_time("T", 0, 2**62, max_num=100)
    assert len(everything) == 5
    assert [m.store_ts_ms for m in everything] == sorted(m.store_ts_ms for m in everything)
    last = everything[-1].store_ts_ms
    assert [m.msg_id for m in admin.query_by_time("T", last, 2**62)] == [
        m.msg_id for m in everything if m.store_ts_ms >= last
    ]
    assert admin.query_by_time("T", 0, 2**62, max_num=2) == everything[:2]


@pytest.mark.parametrize(
    ("topic", "begin", "end", "max_num", "error"),
    [
        ("T", 10, 5, 32, InvalidArgumentError),
        ("T", -1, 5, 32, InvalidArgumentError),
        ("T", 0, 5, 0, InvalidArgumentError),
        ("Nope", 0, 5, 32, TopicNotFoundError),
    ],
)
def test_query_by_time_bad_input_is_a_typed_error(
    admin: Admin, topic: str, begin: int, end: int, max_num: int, error: type[Exception]
) -> None:
    with pytest.raises(error):
        admin.query_by_time(topic, begin, end, max_num)


def test_a_running_producer_sees_new_queues_at_its_next_route_refresh(
    store: Store, admin: Admin, monkeypatch: pytest.MonkeyPatch
) -> None:
    from engine.store import topics

    class Clock:
        now = 1000.0

        def monotonic(self) -> float:
            return self.now

    clock = Clock()
    monkeypatch.setattr(topics, "time", clock)
    producer_store = Store.open(store.root)
    with Producer(producer_store) as producer:
        producer.send(Message("T", b"before"))  # the route is read at 1000.0
        admin.update_topic("T", queues=4)
        clock.now += topics.ROUTE_REFRESH_S / 2
        cached = {producer.send(Message("T", b"cached")).queue_id for _ in range(4)}
        assert cached <= {0, 1}  # not due yet: the route is cached
        clock.now += topics.ROUTE_REFRESH_S * 0.6  # due, counted from the last check, not the last send
        fresh = {producer.send(Message("T", b"after")).queue_id for _ in range(4)}
        assert fresh == {0, 1, 2, 3}


def test_ensure_system_topic_creates_a_missing_system_topic_once_and_refuses_user_topics(
    store: Store, admin: Admin
) -> None:
    made = admin.ensure_system_topic("%RETRY%g")
    assert (made.name, made.queues) == ("%RETRY%g", 1)
    version = store.version(schemas.TOPICS)
    assert admin.ensure_system_topic("%RETRY%g") == made
    assert store.version(schemas.TOPICS) == version  # idempotent: nothing written again
    assert admin.ensure_system_topic("SCHEDULE_TOPIC_XXXX").queues == 19
    with pytest.raises(InvalidTopicError, match="not a system topic"):
        admin.ensure_system_topic("Orders")
    with pytest.raises(InvalidTopicError):
        admin.ensure_system_topic("%RETRY% bad")
    assert "Orders" not in store.topic_configs(refresh=True)
