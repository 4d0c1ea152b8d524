"""The RocketMQ endpoint, spoken to by a Python wire client: the name server, send and pull both ways
(what a wire producer sends a Python consumer pulls and the other way round), and offsets."""

from __future__ import annotations

import threading
import time
import zlib
from pathlib import Path
from typing import Any

import pytest

from engine import Admin, Message, Producer, PullConsumer, PullStatus, Store
from engine.broker.dispatch import dispatch_pending
from engine.broker.schedule import deliver_due
from engine.config import load_config
from engine.errors import StoreError
from engine.remoting import RemotingServer, offsets_batch
from engine.remoting.codes import MessageSysFlag, PullSysFlag, RequestCode, ResponseCode
from engine.remoting.message_layout import (
    BatchItem,
    offset_msg_id,
    parse_offset_msg_id,
)
from engine.store import schemas
from tests.helpers import eventually
from tests.remoting.helpers import FAR_FUTURE_MS, versions
from tests.remoting.wire_client import WireClient


# ----------------------------------------------------------------- name server
def test_route_names_this_broker_and_the_topics_queues(server: RemotingServer, namesrv: WireClient) -> None:
    response = namesrv.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"})
    assert response.code == ResponseCode.SUCCESS
    import json

    route = json.loads(response.body)
    assert route["queueDatas"][0]["writeQueueNums"] == 4 and route["queueDatas"][0]["perm"] == 6
    assert route["brokerDatas"][0]["brokerAddrs"] == {"0": server.broker_address}


def test_with_auto_create_off_a_missing_topic_has_no_route_nor_takes_a_send_and_nothing_is_written(
    tmp_path: Path,
) -> None:
    store = Store.open(tmp_path / "manual")
    with RemotingServer(
        store, namesrv_port=0, broker_port=0, run_broker_jobs=False, auto_create_topics=False
    ) as srv:
        namesrv, broker = WireClient(srv.namesrv_address), WireClient(srv.broker_address)
        before = versions(store)
        response = namesrv.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "Nope"})
        assert response.code == ResponseCode.TOPIC_NOT_EXIST
        assert broker.send("Nope", b"body").code == ResponseCode.TOPIC_NOT_EXIST
        assert namesrv.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TBW102"}).code == (
            ResponseCode.TOPIC_NOT_EXIST
        )  # no template either
        assert versions(store) == before
        namesrv.close()
        broker.close()


def test_the_template_topic_has_a_route_and_is_never_stored(
    store: Store, server: RemotingServer, namesrv: WireClient
) -> None:
    import json

    before = versions(store)
    response = namesrv.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TBW102"})
    assert response.code == ResponseCode.SUCCESS
    [queue] = json.loads(response.body)["queueDatas"]
    # read, write and inherit: a topic made from it on a send takes its queues
    assert (queue["perm"], queue["writeQueueNums"]) == (7, store.config.default_queues)
    assert versions(store) == before


def test_cluster_info_lists_the_one_broker(server: RemotingServer, namesrv: WireClient) -> None:
    import json

    info = json.loads(namesrv.call(RequestCode.GET_BROKER_CLUSTER_INFO).body)
    [broker] = info["brokerAddrTable"].values()
    assert broker["brokerAddrs"]["0"] == server.broker_address
    assert info["clusterAddrTable"] == {broker["cluster"]: [broker["brokerName"]]}


# ----------------------------------------------------------------- send and pull, both doors
def test_wire_send_is_pulled_by_a_python_consumer(
    store: Store, broker: WireClient, server: RemotingServer
) -> None:
    props = {
        "TAGS": "TagA",
        "KEYS": "k1 k2",
        "UNIQ_KEY": "C0A80001" + "0" * 24,
        "color": "red",
        "WAIT": "true",
    }
    response = broker.send("T", b"from java", queue_id=2, properties=props)
    assert response.code == ResponseCode.SUCCESS
    assert response.ext_fields["queueId"] == "2" and response.ext_fields["queueOffset"] == "0"
    host, port, physical = parse_offset_msg_id(response.ext_fields["msgId"])
    assert (host, port) == ("127.0.0.1", server.broker_port)
    dispatch_pending(store)
    result = PullConsumer(store, "PyGroup").pull("T", 2, 0)
    assert result.status is PullStatus.FOUND
    [m] = result.messages
    assert (m.body, m.tags, m.keys, m.uniq_key) == (b"from java", "TagA", ("k1", "k2"), props["UNIQ_KEY"])
    assert m.properties["color"] == "red" and "WAIT" not in m.properties
    assert m.physical_offset == physical


def test_python_send_is_pulled_over_the_wire(
    store: Store, broker: WireClient, server: RemotingServer
) -> None:
    with Producer(store) as producer:
        sent = producer.send(Message("T", b"from python", tags="TagB", keys=["order-9"]), queue_id=1)
    dispatch_pending(store)
    response, messages = broker.pull("G", "T", 1, 0)
    assert response.code == ResponseCode.SUCCESS
    assert response.ext_fields["nextBeginOffset"] == "1" and response.ext_fields["maxOffset"] == "1"
    [m] = messages
    assert (m.topic, m.queue_id, m.queue_offset, m.body) == ("T", 1, 0, b"from python")
    assert m.properties["TAGS"] == "TagB" and m.properties["KEYS"] == "order-9"
    assert m.properties["UNIQ_KEY"] == sent.msg_id
    assert m.msg_id == offset_msg_id("127.0.0.1", server.broker_port, sent.physical_offset)


def test_v1_header_names_send_as_well(store: Store, broker: WireClient) -> None:
    assert broker.send("T", b"v1", queue_id=0, v2=False).code == ResponseCode.SUCCESS
    dispatch_pending(store)
    assert [m.body for m in PullConsumer(store, "G").pull("T", 0, 0).messages] == [b"v1"]


def test_a_batch_lands_in_one_queue_in_order_in_one_commit(store: Store, broker: WireClient) -> None:
    before = store.version(schemas.COMMIT_LOG)
    items = [BatchItem(f"b{i}".encode(), {"TAGS": "A", "UNIQ_KEY": f"{i:032X}"}) for i in range(3)]
    response = broker.send_batch("T", items, queue_id=3)
    assert response.code == ResponseCode.SUCCESS and len(response.ext_fields["msgId"].split(",")) == 3
    assert store.version(schemas.COMMIT_LOG) == before + 1
    dispatch_pending(store)
    messages = PullConsumer(store, "G").pull("T", 3, 0).messages
    assert [(m.body, m.queue_offset, m.uniq_key) for m in messages] == [
        (b"b0", 0, f"{0:032X}"),
        (b"b1", 1, f"{1:032X}"),
        (b"b2", 2, f"{2:032X}"),
    ]


def test_a_compressed_body_is_stored_inflated(store: Store, broker: WireClient) -> None:
    body = b"x" * 10_000
    flag = int(MessageSysFlag.COMPRESSED)
    assert broker.send("T", zlib.compress(body), sys_flag=flag).code == ResponseCode.SUCCESS
    dispatch_pending(store)
    assert PullConsumer(store, "G").pull("T", 0, 0).messages[0].body == body


def test_a_delay_level_goes_through_the_schedule_topic(store: Store, broker: WireClient) -> None:
    response = broker.send("T", b"later", queue_id=1, properties={"DELAY": "2"})
    assert response.code == ResponseCode.SUCCESS and response.ext_fields["queueId"] == "1"
    dispatch_pending(store)
    assert PullConsumer(store, "G").pull("T", 1, 0).status is PullStatus.NO_NEW_MSG
    deliver_due(store, now_ms=FAR_FUTURE_MS)
    dispatch_pending(store)
    assert [m.body for m in PullConsumer(store, "G").pull("T", 1, 0).messages] == [b"later"]


@pytest.mark.parametrize(
    ("offset", "code", "next_offset"),
    [(1, ResponseCode.PULL_NOT_FOUND, 1), (5, ResponseCode.PULL_OFFSET_MOVED, 1)],
)
def test_pull_statuses_and_offset_corrections(
    store: Store, broker: WireClient, offset: int, code: int, next_offset: int
) -> None:
    broker.send("T", b"one", queue_id=0)
    dispatch_pending(store)
    response, messages = broker.pull("G", "T", 0, offset)
    assert (response.code, messages) == (code, [])
    assert response.ext_fields["nextBeginOffset"] == str(next_offset)
    assert (response.ext_fields["minOffset"], response.ext_fields["maxOffset"]) == ("0", "1")


def test_tag_and_sql92_subscriptions_filter_on_the_server(store: Store, broker: WireClient) -> None:
    broker.send("T", b"a", properties={"TAGS": "TagA", "n": "1"})
    broker.send("T", b"b", properties={"TAGS": "TagB", "n": "7"})
    dispatch_pending(store)
    sub = int(PullSysFlag.SUBSCRIPTION)
    _, tagged = broker.pull("G", "T", 0, 0, sys_flag=sub, subscription="TagB || TagC")
    assert [m.body for m in tagged] == [b"b"]
    _, by_sql = broker.pull("G", "T", 0, 0, sys_flag=sub, subscription="n > 5", expression_type="SQL92")
    assert [m.body for m in by_sql] == [b"b"]
    response, none = broker.pull("G", "T", 0, 0, sys_flag=sub, subscription="TagZ")
    assert (response.code, none, response.ext_fields["nextBeginOffset"]) == (
        ResponseCode.PULL_RETRY_IMMEDIATELY,
        [],
        "2",
    )


def test_a_message_keeps_its_flag_born_host_and_born_timestamp_as_the_client_sent_them(
    store: Store, server: RemotingServer, broker: WireClient
) -> None:
    born = 1_700_000_000_123
    assert broker.send("T", b"single", queue_id=1, flag=7, born_ts_ms=born).code == ResponseCode.SUCCESS
    batch = [BatchItem(b"b0", {}, flag=-3), BatchItem(b"b1", {})]
    assert broker.send_batch("T", batch, queue_id=1).code == ResponseCode.SUCCESS
    response, messages = broker.pull("G", "T", 1, 0)
    assert response.code == ResponseCode.SUCCESS
    assert [(m.body, m.flag) for m in messages] == [(b"single", 7), (b"b0", -3), (b"b1", 0)]
    assert {m.born_host for m in messages} == {broker.address}  # the producer, not the broker
    assert messages[0].born_ts_ms == born
    assert all("__BORNHOST" not in m.properties and "__FLAG" not in m.properties for m in messages)
    # The Python API sees what the door kept, under the broker-owned names.
    [first, *_] = PullConsumer(store, "py").pull("T", 1, 0).messages
    assert first.properties["__FLAG"] == "7"
    assert first.properties["__BORNHOST"] == "{}:{}".format(*broker.address)
    assert first.born_ts_ms == born


def test_a_send_after_its_topic_was_deleted_creates_it_again(
    store: Store, server: RemotingServer, broker: WireClient
) -> None:
    assert broker.send("Fleeting", b"first", queue_id=0).code == ResponseCode.SUCCESS
    Admin(store).delete_topic("Fleeting", force=True)
    assert broker.send("Fleeting", b"second", queue_id=0).code == ResponseCode.SUCCESS
    assert store.topic_configs(refresh=True).get("Fleeting") is not None


def test_a_client_cannot_forge_the_broker_owned_born_host_or_flag(
    server: RemotingServer, broker: WireClient
) -> None:
    forged = {"__BORNHOST": "10.9.8.7:1", "__FLAG": "99"}
    assert broker.send("T", b"forged", queue_id=3, properties=forged).code == ResponseCode.SUCCESS
    [message] = broker.pull("G", "T", 3, 0)[1]
    assert (message.born_host, message.flag) == (broker.address, 0)


def test_a_suspended_pull_is_woken_by_a_send(
    store: Store, server: RemotingServer, broker: WireClient
) -> None:
    flags = int(PullSysFlag.SUSPEND | PullSysFlag.SUBSCRIPTION)
    results: list[object] = []
    puller = threading.Thread(
        target=lambda: results.append(
            broker.pull("G", "T", 2, 0, sys_flag=flags, suspend_ms=20_000, timeout=60)
        )
    )
    puller.start()
    sender = WireClient(server.broker_address)
    sender.send("T", b"wake up", queue_id=2)
    sender.close()
    dispatch_pending(store)
    puller.join(60)
    [(response, messages)] = results  # type: ignore[misc]
    assert response.code == ResponseCode.SUCCESS
    assert [m.body for m in messages] == [b"wake up"]


# ----------------------------------------------------------------- offsets
def test_the_offset_piggybacked_on_a_pull_is_seen_at_once_and_committed_by_the_flush(
    store: Store, server: RemotingServer, broker: WireClient
) -> None:
    flags = int(PullSysFlag.COMMIT_OFFSET)
    broker.pull("G", "T", 0, 0, sys_flag=flags, commit_offset=3)
    query = {"consumerGroup": "G", "topic": "T", "queueId": 0}
    response = broker.call(RequestCode.QUERY_CONSUMER_OFFSET, query)
    assert (response.code, response.ext_fields["offset"]) == (ResponseCode.SUCCESS, "3")
    server.ctx.offsets.flush()
    assert PullConsumer(store, "G").committed_offset("T", 0) == 3


def _held_offset_commits(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, threading.Event]:
    """Make the wire offsets' commits wait: the first event is set as one starts, the second lets
    it go on."""
    committing, release = threading.Event(), threading.Event()
    commit = offsets_batch.OffsetStore.commit

    def held_commit(self: Any, entries: Any) -> Any:
        committing.set()
        release.wait(60)
        return commit(self, entries)

    monkeypatch.setattr(offsets_batch.OffsetStore, "commit", held_commit)
    return committing, release


def test_a_failed_flush_keeps_the_offsets_of_the_groups_it_did_not_reach(
    store: Store, server: RemotingServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    offsets = server.ctx.offsets
    commit = offsets_batch.OffsetStore.commit

    def failing_for_a(self: Any, entries: Any) -> Any:
        if self.group == "GA":
            raise StoreError("disk full")
        return commit(self, entries)

    with offsets._flush_lock:  # the server's own flusher stays out until the reports are in
        assert offsets.put("GA", "T", 0, 3) and offsets.put("GB", "T", 0, 7)
        monkeypatch.setattr(offsets_batch.OffsetStore, "commit", failing_for_a)
    with pytest.raises(StoreError):
        offsets.flush()  # groups go in order: GA fails first, GB is not tried
    assert (offsets.pending("GA", "T", 0), offsets.pending("GB", "T", 0)) == (3, 7)
    monkeypatch.setattr(offsets_batch.OffsetStore, "commit", commit)
    offsets.flush()  # (or the server's own flusher, first)
    assert PullConsumer(store, "GA").committed_offset("T", 0) == 3
    assert PullConsumer(store, "GB").committed_offset("T", 0) == 7


def test_a_query_while_the_flush_commits_an_offset_sees_that_offset(
    server: RemotingServer, broker: WireClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The flush takes what was reported and then commits it: a query in between found it neither
    # reported nor committed (CI: 0 for a reported 2).
    fields = {"consumerGroup": "G4", "topic": "T", "queueId": 1, "commitOffset": 2}
    assert broker.call(RequestCode.UPDATE_CONSUMER_OFFSET, fields).code == ResponseCode.SUCCESS
    committing, release = _held_offset_commits(monkeypatch)
    flushing = threading.Thread(target=server.ctx.offsets.flush)
    flushing.start()
    query = {"consumerGroup": "G4", "topic": "T", "queueId": 1}
    try:
        assert committing.wait(30)
        assert broker.call(RequestCode.QUERY_CONSUMER_OFFSET, query).ext_fields["offset"] == "2"
    finally:
        release.set()
        flushing.join(30)
    assert broker.call(RequestCode.QUERY_CONSUMER_OFFSET, query).ext_fields["offset"] == "2"


def test_an_offset_reported_again_while_the_flush_commits_another_is_kept(
    store: Store, server: RemotingServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Committed 5, then a reset's 0 is being committed when the client reports 5 again: 5 equals
    # the last committed offset but not the one landing, so it must be kept (it was dropped).
    offsets = server.ctx.offsets
    with offsets._flush_lock:  # the server's own flusher stays out until the reports are in
        assert offsets.put("G5", "T", 1, 5)
    offsets.flush()
    assert offsets.put("G5", "T", 1, 0)
    committing, release = _held_offset_commits(monkeypatch)
    flushing = threading.Thread(target=offsets.flush)
    flushing.start()
    try:
        assert committing.wait(30)
        assert offsets.put("G5", "T", 1, 5)  # kept for the next flush
    finally:
        release.set()
        flushing.join(30)
    offsets.flush()
    assert PullConsumer(store, "G5").committed_offset("T", 1) == 5


def test_offsets_committed_within_one_millisecond_keep_their_order(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The batcher above commits through a new OffsetStore each time: a reset's 0 and the report of
    # 5 after it, flushed within one millisecond, once tied on their time and the read order of the
    # table's files chose between them (the test above failed so, under load).
    monkeypatch.setattr("engine.store.consumer_offset.now_ms", lambda: 1_000)
    for offset in (5, 0, 5, 0, 7):
        offsets_batch.OffsetStore(store, "Gms").commit([("T", 1, offset)])
    rows = [r for r in store.read(schemas.CONSUMER_OFFSET).to_pylist() if r["group"] == "Gms"]
    assert [r["offset"] for r in sorted(rows, key=lambda r: r["ts_ms"])] == [5, 0, 5, 0, 7]
    assert len({r["ts_ms"] for r in rows}) == 5
    assert offsets_batch.OffsetStore(store, "Gms").read("T") == {("T", 1): 7}


def test_offsets_of_many_queues_are_one_commit_and_an_unchanged_one_none(
    store: Store, server: RemotingServer, broker: WireClient
) -> None:
    flags = int(PullSysFlag.COMMIT_OFFSET)
    # The server's own flusher may run too: block it out by holding the flush lock while reporting.
    with server.ctx.offsets._flush_lock:
        version = store.version(schemas.CONSUMER_OFFSET)
        for queue_id in range(4):
            broker.pull("G", "T", queue_id, 0, sys_flag=flags, commit_offset=2)
    server.ctx.offsets.flush()
    assert store.version(schemas.CONSUMER_OFFSET) == version + 1
    assert PullConsumer(store, "G").committed_offset("T", 3) == 2
    broker.pull("G", "T", 0, 0, sys_flag=flags, commit_offset=2)
    assert server.ctx.offsets.flush() == 0
    assert store.version(schemas.CONSUMER_OFFSET) == version + 1


def test_update_consumer_offset_one_way_then_query(
    store: Store, server: RemotingServer, broker: WireClient
) -> None:
    fields = {"consumerGroup": "G2", "topic": "T", "queueId": 1, "commitOffset": 9}
    assert broker.call(RequestCode.UPDATE_CONSUMER_OFFSET, fields).code == ResponseCode.SUCCESS
    server.ctx.offsets.flush()
    assert PullConsumer(store, "G2").committed_offset("T", 1) == 9


def test_one_way_offset_reports_of_a_queue_are_kept_in_the_order_they_arrive(
    server: RemotingServer, broker: WireClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A Java consumer reports a reset offset it followed and then its progress back to back: kept
    # out of order (the first one slower to keep), the older report would win.
    kept: list[int] = []
    put = server.ctx.offsets.put

    def slow_first(group: str, topic: str, queue_id: int, offset: int) -> bool:
        if offset == 1:
            time.sleep(0.3)
        done = put(group, topic, queue_id, offset)
        kept.append(offset)
        return done

    monkeypatch.setattr(server.ctx.offsets, "put", slow_first)
    for offset in (1, 2):
        fields = {"consumerGroup": "G3", "topic": "T", "queueId": 1, "commitOffset": offset}
        broker.request(RequestCode.UPDATE_CONSUMER_OFFSET, fields, oneway=True)
    eventually(lambda: len(kept) == 2)
    assert kept == [1, 2]
    query = {"consumerGroup": "G3", "topic": "T", "queueId": 1}
    assert broker.call(RequestCode.QUERY_CONSUMER_OFFSET, query).ext_fields["offset"] == "2"


def test_a_new_group_on_an_old_queue_gets_query_not_found(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "old", config=load_config(in_memory_max_bytes=0))
    Admin(store).create_topic("T", 1)
    with RemotingServer(store, namesrv_port=0, broker_port=0, run_broker_jobs=False) as srv:
        client = WireClient(srv.broker_address)
        fields = {"consumerGroup": "New", "topic": "T", "queueId": 0}
        assert client.call(RequestCode.QUERY_CONSUMER_OFFSET, fields).code == ResponseCode.QUERY_NOT_FOUND
        client.close()


def test_a_new_group_on_a_young_queue_starts_at_zero(broker: WireClient) -> None:
    response = broker.call(
        RequestCode.QUERY_CONSUMER_OFFSET, {"consumerGroup": "New", "topic": "T", "queueId": 0}
    )
    assert (response.code, response.ext_fields["offset"]) == (ResponseCode.SUCCESS, "0")


def test_min_max_search_and_earliest_store_time(store: Store, broker: WireClient) -> None:
    for i in range(3):
        broker.send("T", f"m{i}".encode(), queue_id=0)
    dispatch_pending(store)
    first = PullConsumer(store, "G").pull("T", 0, 0).messages
    q = {"topic": "T", "queueId": 0}
    assert broker.call(RequestCode.GET_MAX_OFFSET, q).ext_fields["offset"] == "3"
    assert broker.call(RequestCode.GET_MIN_OFFSET, q).ext_fields["offset"] == "0"
    earliest = broker.call(RequestCode.GET_EARLIEST_MSG_STORETIME, q).ext_fields["timestamp"]
    assert earliest == str(first[0].store_ts_ms)
    search = {**q, "timestamp": first[2].store_ts_ms}
    assert broker.call(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, search).ext_fields["offset"] in {"1", "2"}
    assert (
        broker.call(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, {**q, "timestamp": FAR_FUTURE_MS}).ext_fields[
            "offset"
        ]
        == "3"
    )
    missing = broker.call(RequestCode.GET_MAX_OFFSET, {"topic": "Nope", "queueId": 0})
    assert missing.code == ResponseCode.TOPIC_NOT_EXIST
