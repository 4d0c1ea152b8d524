"""The RocketMQ endpoint, spoken to by a Python wire client: every request runs the engine's own
calls, so what a wire producer sends a Python consumer pulls and the other way round."""

from __future__ import annotations

import threading
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine import Admin, Message, Producer, PullConsumer, PullStatus, Store
from engine.broker.dispatch import dispatch_pending
from engine.broker.index import index_pending
from engine.broker.retry import route_retries
from engine.broker.schedule import deliver_due
from engine.broker.transactions import check_transactions
from engine.client.membership import live_members
from engine.config import load_config
from engine.remoting import RemotingServer
from engine.remoting.codes import MessageSysFlag, PullSysFlag, RequestCode, ResponseCode
from engine.remoting.frames import RemotingCommand
from engine.remoting.message_layout import (
    BatchItem,
    decode_stored,
    encode_properties,
    offset_msg_id,
    parse_offset_msg_id,
)
from engine.store import schemas
from engine.store.store import now_ms
from tests.remoting_client import WireClient

FAR_FUTURE_MS = 4_102_444_800_000  # 2100-01-01


@pytest.fixture
def server(store: Store) -> Iterator[RemotingServer]:
    """An endpoint on ephemeral ports; no background jobs, so each test dispatches when it means to."""
    Admin(store).create_topic("T", 4)
    with RemotingServer(store, namesrv_port=0, broker_port=0, run_broker_jobs=False) as srv:
        yield srv


@pytest.fixture
def broker(server: RemotingServer) -> Iterator[WireClient]:
    client = WireClient(server.broker_address)
    yield client
    client.close()


@pytest.fixture
def namesrv(server: RemotingServer) -> Iterator[WireClient]:
    client = WireClient(server.namesrv_address)
    yield client
    client.close()


def _versions(store: Store) -> dict[str, int]:
    return {name: store.version(name) for name in schemas.SCHEMAS}


# ----------------------------------------------------------------- name server
def test_route_names_this_broker_and_the_topics_queues(server: RemotingServer, namesrv: WireClient) -> None:
    response = namesrv.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"})
    assert response.code == ResponseCode.SUCCESS
    import json

    route = json.loads(response.body)
    assert route["queueDatas"][0]["writeQueueNums"] == 4 and route["queueDatas"][0]["perm"] == 6
    assert route["brokerDatas"][0]["brokerAddrs"] == {"0": server.broker_address}


def test_route_of_a_missing_topic_is_topic_not_exist_and_writes_nothing(
    store: Store, namesrv: WireClient
) -> None:
    before = _versions(store)
    response = namesrv.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "Nope"})
    assert response.code == ResponseCode.TOPIC_NOT_EXIST
    assert _versions(store) == before


def test_auto_create_topics_creates_a_topic_on_its_first_route(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "auto")
    with RemotingServer(
        store, namesrv_port=0, broker_port=0, run_broker_jobs=False, auto_create_topics=True
    ) as srv:
        client = WireClient(srv.namesrv_address)
        assert (
            client.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "Fresh"}).code == ResponseCode.SUCCESS
        )
        assert (
            client.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TBW102"}).code
            == ResponseCode.TOPIC_NOT_EXIST
        )
        client.close()
    assert store.topic("Fresh").queues == store.config.default_queues


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


def test_a_new_group_on_an_old_queue_gets_query_not_found(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "old", config=load_config(in_memory_age_ms=0))
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


# ----------------------------------------------------------------- clients, locks, send-back
def _heartbeat(client: WireClient, client_id: str, group: str = "CG", producer: str | None = None) -> int:
    import json

    body = {
        "clientID": client_id,
        "consumerDataSet": [
            {
                "groupName": group,
                "messageModel": "CLUSTERING",
                "subscriptionDataSet": [{"topic": "T", "subString": "TagA", "expressionType": "TAG"}],
            }
        ],
        "producerDataSet": [{"groupName": producer}] if producer else [],
    }
    return client.call(RequestCode.HEART_BEAT, body=json.dumps(body).encode()).code


def test_heartbeats_register_members_that_the_consumer_list_serves(
    store: Store, server: RemotingServer, broker: WireClient
) -> None:
    import json

    other = WireClient(server.broker_address)
    assert _heartbeat(broker, "10.0.0.1@a") == ResponseCode.SUCCESS
    assert _heartbeat(other, "10.0.0.2@b") == ResponseCode.SUCCESS
    listed = broker.call(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "CG"})
    assert json.loads(listed.body)["consumerIdList"] == ["10.0.0.1@a", "10.0.0.2@b"]
    # The first member is told to rebalance when the second joins.
    assert broker.server_requests.get(timeout=30).code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED
    assert store.topic("%RETRY%CG").queues == 1
    unregister = {"clientID": "10.0.0.2@b", "consumerGroup": "CG"}
    assert other.call(RequestCode.UNREGISTER_CLIENT, unregister).code == ResponseCode.SUCCESS
    assert live_members(store, "CG", 120_000) == ["10.0.0.1@a"]
    other.close()


def test_a_closed_connection_leaves_its_groups(store: Store, server: RemotingServer) -> None:
    client = WireClient(server.broker_address)
    _heartbeat(client, "10.0.0.3@c", group="Gone")
    assert live_members(store, "Gone", 120_000) == ["10.0.0.3@c"]
    client.close()
    probe = WireClient(server.broker_address)
    listed = None
    for _ in range(300):  # the leave is written after the server notices the close
        listed = probe.call(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "Gone"})
        if listed.code == ResponseCode.SYSTEM_ERROR:
            break
        threading.Event().wait(0.1)
    assert listed is not None and listed.code == ResponseCode.SYSTEM_ERROR
    probe.close()


def test_batch_locks_go_to_one_client_until_it_unlocks(broker: WireClient) -> None:
    import json

    def lock(code: int, client_id: str) -> list[int]:
        body = {
            "consumerGroup": "OG",
            "clientId": client_id,
            "mqSet": [{"topic": "T", "brokerName": "b", "queueId": 0}],
        }
        response = broker.call(code, body=json.dumps(body).encode())
        assert response.code == ResponseCode.SUCCESS
        return [mq["queueId"] for mq in json.loads(response.body)["lockOKMQSet"]] if response.body else []

    assert lock(RequestCode.LOCK_BATCH_MQ, "c1") == [0]
    assert lock(RequestCode.LOCK_BATCH_MQ, "c2") == []
    assert lock(RequestCode.LOCK_BATCH_MQ, "c1") == [0]  # a renewal
    lock(RequestCode.UNLOCK_BATCH_MQ, "c1")
    assert lock(RequestCode.LOCK_BATCH_MQ, "c2") == [0]


def test_send_back_retries_through_the_retry_topic(store: Store, broker: WireClient) -> None:
    response = broker.send("T", b"fails once", queue_id=0, properties={"TAGS": "A"})
    _, _, physical = parse_offset_msg_id(response.ext_fields["msgId"])
    back = {"offset": physical, "group": "RG", "delayLevel": 0, "originMsgId": response.ext_fields["msgId"]}
    assert broker.call(RequestCode.CONSUMER_SEND_MSG_BACK, back).code == ResponseCode.SUCCESS
    assert route_retries(store) == 1
    dispatch_pending(store)  # the schedule topic's entry, which the schedule job reads
    deliver_due(store, now_ms=FAR_FUTURE_MS)
    dispatch_pending(store)
    response, [retried] = broker.pull("RG", "%RETRY%RG", 0, 0)
    assert retried.body == b"fails once" and retried.reconsume_times == 1
    assert retried.properties["RETRY_TOPIC"] == "T"


def test_send_back_with_level_minus_one_dead_letters(store: Store, broker: WireClient) -> None:
    response = broker.send("T", b"poison", queue_id=0)
    _, _, physical = parse_offset_msg_id(response.ext_fields["msgId"])
    back = {"offset": physical, "group": "DG", "delayLevel": -1}
    assert broker.call(RequestCode.CONSUMER_SEND_MSG_BACK, back).code == ResponseCode.SUCCESS
    route_retries(store)
    dispatch_pending(store)
    [dead] = PullConsumer(store, "Ops").pull("%DLQ%DG", 0, 0).messages
    assert dead.body == b"poison"


# ----------------------------------------------------------------- transactions
def _half(broker: WireClient, body: bytes) -> int:
    props = {"TRAN_MSG": "true", "PGROUP": "TxGroup", "UNIQ_KEY": f"{len(body):032X}"}
    flag = int(MessageSysFlag.TRANSACTION_PREPARED)
    response = broker.send("T", body, queue_id=1, properties=props, group="TxGroup", sys_flag=flag)
    assert response.code == ResponseCode.SUCCESS
    return parse_offset_msg_id(response.ext_fields["msgId"])[2]


def _end(broker: WireClient, physical: int, kind: MessageSysFlag, *, from_check: bool = False) -> None:
    fields = {
        "producerGroup": "TxGroup",
        "tranStateTableOffset": 0,
        "commitLogOffset": physical,
        "commitOrRollback": int(kind),
        "fromTransactionCheck": str(from_check).lower(),
        "msgId": "x",
    }
    broker.request(RequestCode.END_TRANSACTION, fields, oneway=True)


def _pulled(store: Store, queue_id: int) -> list[bytes]:
    dispatch_pending(store)
    return [m.body for m in PullConsumer(store, "TxReader").pull("T", queue_id, 0).messages]


def test_a_half_is_pullable_only_after_end_transaction_commits(store: Store, broker: WireClient) -> None:
    committed = _half(broker, b"commit me")
    rolled = _half(broker, b"roll me back")
    assert _pulled(store, 1) == []
    _end(broker, rolled, MessageSysFlag.TRANSACTION_ROLLBACK)
    _end(broker, committed, MessageSysFlag.TRANSACTION_COMMIT)
    bodies: list[bytes] = []
    for _ in range(300):  # one-way requests: wait until the commit is applied
        bodies = _pulled(store, 1)
        if bodies:
            break
        threading.Event().wait(0.1)
    assert bodies == [b"commit me"]


def test_check_back_asks_a_connected_producer_whose_answer_decides(store: Store, broker: WireClient) -> None:
    assert _heartbeat(broker, "10.0.0.9@p", group="Readers", producer="TxGroup") == ResponseCode.SUCCESS
    physical = _half(broker, b"undecided")
    assert check_transactions(store, now_ms=now_ms() + 60_000) >= 1
    request = broker.server_requests.get(timeout=60)
    while request.code != RequestCode.CHECK_TRANSACTION_STATE:
        request = broker.server_requests.get(timeout=60)
    assert request.ext_fields["commitLogOffset"] == str(physical)
    [half] = decode_stored(request.body)
    assert (half.topic, half.queue_id, half.body) == ("T", 1, b"undecided")
    assert half.properties["PGROUP"] == "TxGroup" and half.properties["TRAN_MSG"] == "true"
    _end(broker, physical, MessageSysFlag.TRANSACTION_COMMIT, from_check=True)
    bodies: list[bytes] = []
    for _ in range(300):
        bodies = _pulled(store, 1)
        if bodies:
            break
        threading.Event().wait(0.1)
    assert bodies == [b"undecided"]


# ----------------------------------------------------------------- look-ups
def test_view_by_offset_id_and_query_by_key_and_unique_key(store: Store, broker: WireClient) -> None:
    uniq = "AB" * 16
    sent = broker.send("T", b"findable", queue_id=0, properties={"KEYS": "order-7", "UNIQ_KEY": uniq})
    _, _, physical = parse_offset_msg_id(sent.ext_fields["msgId"])
    dispatch_pending(store)
    index_pending(store)
    [viewed] = decode_stored(broker.call(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": physical}).body)
    assert viewed.body == b"findable" and viewed.physical_offset == physical
    query = {"topic": "T", "key": "order-7", "maxNum": 32, "beginTimestamp": 0, "endTimestamp": FAR_FUTURE_MS}
    [by_key] = decode_stored(broker.call(RequestCode.QUERY_MESSAGE, query).body)
    assert by_key.body == b"findable"
    by_uniq = broker.call(RequestCode.QUERY_MESSAGE, {**query, "key": uniq, "_UNIQUE_KEY_QUERY": "true"})
    assert [m.properties["UNIQ_KEY"] for m in decode_stored(by_uniq.body)] == [uniq]
    nothing = broker.call(RequestCode.QUERY_MESSAGE, {**query, "key": "no-such-key"})
    assert nothing.code == ResponseCode.QUERY_NOT_FOUND


def test_topic_admin_over_the_wire(store: Store, broker: WireClient) -> None:
    import json

    fields = {"topic": "Made", "readQueueNums": 2, "writeQueueNums": 2, "perm": 6}
    assert broker.call(RequestCode.UPDATE_AND_CREATE_TOPIC, fields).code == ResponseCode.SUCCESS
    assert store.topic("Made").queues == 2
    table = json.loads(broker.call(RequestCode.GET_ALL_TOPIC_CONFIG).body)["topicConfigTable"]
    assert table["Made"]["writeQueueNums"] == 2 and table["T"]["writeQueueNums"] == 4


# ----------------------------------------------------------------- refusals
def test_unknown_request_code_is_not_supported(broker: WireClient) -> None:
    response = broker.call(9999)
    assert response.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED


def test_oversized_body_is_message_illegal_and_writes_nothing(store: Store, broker: WireClient) -> None:
    before = _versions(store)
    response = broker.send("T", b"x" * (4 * 1024 * 1024 + 1))
    assert response.code == ResponseCode.MESSAGE_ILLEGAL
    assert _versions(store) == before


@pytest.mark.parametrize(
    ("topic", "queue_id", "props", "code"),
    [
        ("Nope", 0, {}, ResponseCode.TOPIC_NOT_EXIST),
        ("T", 9, {}, ResponseCode.SYSTEM_ERROR),
        ("T", 0, {"DELAY": "soon"}, ResponseCode.MESSAGE_ILLEGAL),
        ("%DLQ%x", 0, {}, ResponseCode.MESSAGE_ILLEGAL),
    ],
)
def test_bad_sends_get_rocketmq_errors_and_write_nothing(
    store: Store, broker: WireClient, topic: str, queue_id: int, props: dict[str, str], code: int
) -> None:
    before = _versions(store)
    assert broker.send(topic, b"body", queue_id=queue_id, properties=props).code == code
    assert _versions(store) == before


def test_a_missing_header_field_is_a_system_error(broker: WireClient) -> None:
    response = broker.call(RequestCode.PULL_MESSAGE, {"consumerGroup": "G", "topic": "T"})
    assert response.code == ResponseCode.SYSTEM_ERROR and "queueId" in (response.remark or "")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"broker_port": 70000}, "broker_port"),
        ({"namesrv_port": -1}, "namesrv_port"),
        ({"broker_port": True}, "broker_port"),
        ({"max_frame_bytes": 10}, "max_frame_bytes"),
        ({"idle_timeout_s": 0}, "idle_timeout_s"),
    ],
)
def test_bad_server_settings_are_refused_before_binding(
    store: Store, kwargs: dict[str, object], match: str
) -> None:
    from engine.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match=match):
        RemotingServer(store, **kwargs)  # type: ignore[arg-type]


def test_a_taken_port_fails_start_with_os_error(store: Store, server: RemotingServer) -> None:
    with pytest.raises(OSError):
        RemotingServer(store, namesrv_port=0, broker_port=server.broker_port, run_broker_jobs=False).start()


def test_requests_past_the_in_flight_limit_get_system_busy(store: Store) -> None:
    with RemotingServer(store, namesrv_port=0, broker_port=0, run_broker_jobs=False, max_in_flight=1) as srv:
        Admin(store).create_topic("Busy", 1)
        client = WireClient(srv.broker_address)
        flags = int(PullSysFlag.SUSPEND)
        # A suspended pull holds the only slot until a message arrives; the next request is refused.
        parked = threading.Thread(
            target=lambda: client.pull("G", "Busy", 0, 0, sys_flag=flags, suspend_ms=20_000, timeout=60)
        )
        parked.start()
        response = client.call(RequestCode.GET_MAX_OFFSET, {"topic": "Busy", "queueId": 0})
        while response.code == ResponseCode.SUCCESS:  # until the pull is parked
            response = client.call(RequestCode.GET_MAX_OFFSET, {"topic": "Busy", "queueId": 0})
        assert response.code == ResponseCode.SYSTEM_BUSY
        with Producer(store) as producer:
            producer.send(Message("Busy", b"release"))
        dispatch_pending(store)
        parked.join(60)
        assert (
            client.call(RequestCode.GET_MAX_OFFSET, {"topic": "Busy", "queueId": 0}).code
            == ResponseCode.SUCCESS
        )
        client.close()


def _retry_send(broker: WireClient, body: bytes, times: int, limit: int, delay: int) -> RemotingCommand:
    props = {"RETRY_TOPIC": "T", "ORIGIN_MESSAGE_ID": "ORIG", "UNIQ_KEY": "CD" * 16, "DELAY": str(delay)}
    fields = {
        "a": "CLIENT_INNER_PRODUCER",
        "b": "%RETRY%OG",
        "c": "TBW102",
        "d": 4,
        "e": 0,
        "f": 0,
        "g": 0,
        "h": 0,
        "i": encode_properties(props),
        "j": times,
        "k": "false",
        "l": limit,
    }
    return broker.call(RequestCode.SEND_MESSAGE_V2, fields, body)


def test_a_retry_send_past_the_maximum_is_dead_lettered(store: Store, broker: WireClient) -> None:
    # An orderly consumer's sendMessageBack: a plain send to %RETRY%<group> at its maximum.
    assert _retry_send(broker, b"poisoned", times=16, limit=16, delay=19).code == ResponseCode.SUCCESS
    dispatch_pending(store)
    [dead] = PullConsumer(store, "Ops").pull("%DLQ%OG", 0, 0).messages
    assert (dead.body, dead.uniq_key, dead.reconsume_times) == (b"poisoned", "CD" * 16, 16)
    assert dead.properties["RETRY_TOPIC"] == "T"


def test_a_retry_send_below_the_maximum_waits_its_level_then_lands_in_the_retry_topic(
    store: Store, broker: WireClient
) -> None:
    assert _retry_send(broker, b"again", times=1, limit=16, delay=4).code == ResponseCode.SUCCESS
    dispatch_pending(store)
    assert store.topic_configs(refresh=True).get("%RETRY%OG") is not None
    assert PullConsumer(store, "OG").pull("%RETRY%OG", 0, 0).status is PullStatus.NO_NEW_MSG
    deliver_due(store, now_ms=FAR_FUTURE_MS)
    dispatch_pending(store)
    [retried] = PullConsumer(store, "OG").pull("%RETRY%OG", 0, 0).messages
    assert (retried.body, retried.reconsume_times) == (b"again", 1)
