"""The RocketMQ endpoint's client requests: heartbeats and the consumer list, queue locks, send-back
and retry sends, transactions with check-back, look-ups and topic admin."""

from __future__ import annotations

import threading

from engine import PullConsumer, PullStatus, Store
from engine.broker.dispatch import dispatch_pending
from engine.broker.index import index_pending
from engine.broker.retry import route_retries
from engine.broker.schedule import deliver_due
from engine.broker.transactions import check_transactions
from engine.client.membership import live_members
from engine.remoting import RemotingServer
from engine.remoting.codes import MessageSysFlag, RequestCode, ResponseCode
from engine.remoting.frames import RemotingCommand
from engine.remoting.message_layout import (
    decode_stored,
    encode_properties,
    parse_offset_msg_id,
)
from engine.store.store import now_ms
from tests.remoting.helpers import FAR_FUTURE_MS
from tests.remoting.wire_client import WireClient


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
    # Every member is told to rebalance when one joins, the joiner too (RocketMQ's getAllChannel):
    # the first member at its own join and at the second's, the second at its own.
    codes = [broker.server_requests.get(timeout=30).code for _ in range(2)]
    assert codes == [RequestCode.NOTIFY_CONSUMER_IDS_CHANGED] * 2
    assert other.server_requests.get(timeout=30).code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED
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
