"""The admin requests over the wire without a JVM: bodies as fastjson writes them, requests forwarded
to a consumer client and its answer passed back, and bad input answered with RocketMQ's error codes
and no table written. ``test_mqadmin.py`` runs the unmodified mqadmin against the same handlers."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

from engine import Admin, Message, Producer, Store
from engine.broker.dispatch import dispatch_pending
from engine.remoting import RemotingServer
from engine.remoting.codes import RPC_RESPONSE, RequestCode, ResponseCode
from engine.remoting.frames import RemotingCommand, encode_command
from engine.remoting.handlers.admin import Keyed, fastjson, message_queue
from engine.remoting.handlers.admin_stats import _human
from engine.remoting.message_layout import BatchItem, encode_batch
from engine.store.consumer_offset import OffsetStore
from tests.remoting.helpers import versions
from tests.remoting.wire_client import WireClient


def _consumer_heartbeat(client: WireClient, client_id: str, group: str) -> None:
    body = {
        "clientID": client_id,
        "consumerDataSet": [
            {
                "groupName": group,
                "consumeType": "CONSUME_PASSIVELY",
                "messageModel": "CLUSTERING",
                "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET",
                "subscriptionDataSet": [{"topic": "T", "subString": "TagA || TagB", "expressionType": "TAG"}],
            }
        ],
        "producerDataSet": [],
    }
    assert client.call(RequestCode.HEART_BEAT, body=json.dumps(body).encode()).code == ResponseCode.SUCCESS


def _send_known(store: Store, per_queue: dict[int, int]) -> None:
    with Producer(store) as producer:
        for qid, count in per_queue.items():
            for i in range(count):
                producer.send(Message("T", f"{qid}-{i}".encode()), queue_id=qid)
    dispatch_pending(store)


def test_fastjson_writes_message_queue_keys_as_objects() -> None:
    table = Keyed(((message_queue("T", 1), {"maxOffset": 3}),))
    assert fastjson({"offsetTable": table, "consumeTps": 0.5}) == (
        '{"offsetTable":{{"brokerName":"lakemq-broker-a","queueId":1,"topic":"T"}:{"maxOffset":3}},'
        '"consumeTps":0.5}'
    )


def test_human_byte_counts_use_rocketmqs_binary_units() -> None:
    assert [_human(n) for n in (512, 2048, 3 * 1024**3)] == ["512 B", "2.0 KiB", "3.0 GiB"]


def test_topic_stats_are_the_queues_offsets(store: Store, broker: WireClient) -> None:
    _send_known(store, {0: 2, 3: 1})
    response = broker.call(RequestCode.GET_TOPIC_STATS_INFO, {"topic": "T"})
    assert response.code == ResponseCode.SUCCESS
    found = re.findall(
        r'"queueId":(\d),"topic":"T"\}:\{"lastUpdateTimestamp":(\d+),"maxOffset":(\d+)',
        response.body.decode(),
    )
    assert {int(q): int(m) for q, _, m in found} == {0: 2, 1: 0, 2: 0, 3: 1}
    assert {int(q) for q, ts, _ in found if int(ts) > 0} == {0, 3}


def test_unknown_topic_stats_is_topic_not_exist(store: Store, broker: WireClient) -> None:
    response = broker.call(RequestCode.GET_TOPIC_STATS_INFO, {"topic": "Nope"})
    assert response.code == ResponseCode.TOPIC_NOT_EXIST


def test_consumer_connection_comes_from_the_heartbeat(server: RemotingServer, broker: WireClient) -> None:
    _consumer_heartbeat(broker, "10.0.0.7@c", "AdmG")
    response = broker.call(RequestCode.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": "AdmG"})
    assert response.code == ResponseCode.SUCCESS
    body = json.loads(response.body)
    [connection] = body["connectionSet"]
    assert connection["clientId"] == "10.0.0.7@c" and connection["language"] == "JAVA"
    assert re.fullmatch(r"127\.0\.0\.1:\d+", connection["clientAddr"])
    sub = body["subscriptionTable"]["T"]
    assert sub["tagsSet"] == ["TagA", "TagB"] and sub["codeSet"] == [2598919, 2598920]
    assert body["consumeFromWhere"] == "CONSUME_FROM_FIRST_OFFSET"
    gone = broker.call(RequestCode.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": "NobodyG"})
    assert gone.code == ResponseCode.CONSUMER_NOT_ONLINE


def test_running_info_is_asked_of_the_consumer_and_its_answer_returned(
    server: RemotingServer, broker: WireClient
) -> None:
    consumer = WireClient(server.broker_address)
    pool = ThreadPoolExecutor(1)
    try:
        _consumer_heartbeat(consumer, "10.0.0.8@run", "AdmRun")
        fields = {"consumerGroup": "AdmRun", "clientId": "10.0.0.8@run", "jstackEnable": "false"}
        asked = pool.submit(broker.call, RequestCode.GET_CONSUMER_RUNNING_INFO, fields)
        forwarded = consumer.server_requests.get(timeout=30)
        while forwarded.code != RequestCode.GET_CONSUMER_RUNNING_INFO:
            forwarded = consumer.server_requests.get(timeout=30)
        assert forwarded.ext_fields["clientId"] == "10.0.0.8@run"
        answer = RemotingCommand(
            0, opaque=forwarded.opaque, flag=RPC_RESPONSE, body=b'{"properties":{"x":"1"}}'
        )
        consumer.sock.sendall(encode_command(answer))
        response = asked.result(timeout=30)
        assert response.code == ResponseCode.SUCCESS and json.loads(response.body) == {
            "properties": {"x": "1"}
        }
    finally:
        consumer.close()
        pool.shutdown()
    absent = broker.call(
        RequestCode.GET_CONSUMER_RUNNING_INFO, {"consumerGroup": "AdmRun", "clientId": "x@y"}
    )
    assert absent.code == ResponseCode.SYSTEM_ERROR and "The Consumer <AdmRun> <x@y> not online" in str(
        absent.remark
    )


def test_bad_subscription_group_bodies_write_nothing(store: Store, broker: WireClient) -> None:
    before = versions(store)
    garbage = broker.call(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=b"\xff{not json")
    assert garbage.code == ResponseCode.SYSTEM_ERROR
    bad_name = broker.call(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=b'{"groupName":"a b"}')
    assert bad_name.code == ResponseCode.SYSTEM_ERROR
    disabled = broker.call(
        RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=b'{"groupName":"G1","consumeEnable":false}'
    )
    assert disabled.code == ResponseCode.NO_PERMISSION and "consumeEnable" in str(disabled.remark)
    remove = broker.call(RequestCode.DELETE_SUBSCRIPTIONGROUP, {"groupName": "G1", "removeOffset": "true"})
    assert remove.code == ResponseCode.NO_PERMISSION
    assert versions(store) == before


def test_subscription_group_created_listed_and_deleted(store: Store, broker: WireClient) -> None:
    body = b'{"groupName":"AdmSub","consumeBroadcastEnable":false,"retryMaxTimes":16}'
    assert (
        broker.call(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=body).code == ResponseCode.SUCCESS
    )
    listed = json.loads(broker.call(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG).body)
    assert listed["subscriptionGroupTable"]["AdmSub"]["retryMaxTimes"] == store.config.max_reconsume_times
    assert (
        broker.call(RequestCode.DELETE_SUBSCRIPTIONGROUP, {"groupName": "AdmSub"}).code
        == ResponseCode.SUCCESS
    )
    listed = json.loads(broker.call(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG).body)
    assert "AdmSub" not in listed["subscriptionGroupTable"]


def test_consume_message_orderly_sets_the_groups_fifo(store: Store, broker: WireClient) -> None:
    body = b'{"groupName":"Ordered","consumeMessageOrderly":true}'
    assert (
        broker.call(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=body).code == ResponseCode.SUCCESS
    )
    assert Admin(store).group_config("Ordered").fifo is True
    listed = json.loads(broker.call(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG).body)
    assert listed["subscriptionGroupTable"]["Ordered"]["consumeMessageOrderly"] is True
    bad = b'{"groupName":"Ordered","consumeMessageOrderly":"yes"}'
    assert (
        broker.call(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=bad).code
        == ResponseCode.NO_PERMISSION
    )
    assert Admin(store).group_config("Ordered").fifo is True


def test_bad_admin_requests_get_rocketmq_errors_and_write_nothing(store: Store, broker: WireClient) -> None:
    before = versions(store)
    stats = broker.call(RequestCode.VIEW_BROKER_STATS_DATA, {"statsName": "NOPE", "statsKey": "T"})
    assert stats.code == ResponseCode.SYSTEM_ERROR and stats.remark == "The stats <NOPE> <T> not exist"
    assert (
        broker.call(RequestCode.GET_CONSUME_STATS, {"consumerGroup": "bad group"}).code
        == ResponseCode.SYSTEM_ERROR
    )
    direct = {"consumerGroup": "G", "clientId": "c", "msgId": "zz"}
    assert broker.call(RequestCode.CONSUME_MESSAGE_DIRECTLY, direct).code == ResponseCode.SYSTEM_ERROR
    system = broker.call(RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": "SCHEDULE_TOPIC_XXXX"})
    assert system.code == ResponseCode.SYSTEM_ERROR
    assert broker.call(RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": "NoSuch"}).code == ResponseCode.SUCCESS
    config = broker.call(RequestCode.UPDATE_BROKER_CONFIG, body=b"defaultTopicQueueNums=99\n")
    assert config.code == ResponseCode.NO_PERMISSION and "defaultTopicQueueNums" in str(config.remark)
    same = broker.call(
        RequestCode.UPDATE_BROKER_CONFIG, body=f"defaultTopicQueueNums={store.config.default_queues}".encode()
    )
    assert same.code == ResponseCode.SUCCESS
    assert broker.call(RequestCode.UPDATE_BROKER_CONFIG, body=b"\xff\xfe").code == ResponseCode.SYSTEM_ERROR
    assert broker.call(RequestCode.GET_TOPIC_STATS_INFO, {}).code == ResponseCode.SYSTEM_ERROR
    assert versions(store) == before


def test_runtime_info_and_stats_count_the_stored_messages(store: Store, broker: WireClient) -> None:
    _send_known(store, {0: 2, 1: 3})
    table = json.loads(broker.call(RequestCode.GET_BROKER_RUNTIME_INFO).body)["table"]
    assert table["msgPutTotalTodayNow"] == "5" and table["brokerVersionDesc"] == "V4_9_8"
    assert table["msgGetTotalTodayNow"] == "0"
    stats = json.loads(
        broker.call(RequestCode.VIEW_BROKER_STATS_DATA, {"statsName": "TOPIC_PUT_NUMS", "statsKey": "T"}).body
    )
    assert stats["statsMinute"]["sum"] == 5 and stats["statsDay"]["sum"] == 5
    assert table["putMessageTimesTotal"] == "0"  # the door's puts: none came through it


def test_runtime_info_times_the_puts_that_came_through_the_door(store: Store, broker: WireClient) -> None:
    assert broker.send("T", b"x" * 100).code == ResponseCode.SUCCESS
    batch = [BatchItem(f"b{i}".encode()) for i in range(3)]
    assert broker.send_batch("T", batch, queue_id=1).code == ResponseCode.SUCCESS
    table = json.loads(broker.call(RequestCode.GET_BROKER_RUNTIME_INFO).body)["table"]
    assert table["putMessageTimesTotal"] == "4"
    body_bytes = 100 + len(encode_batch(batch))
    assert table["putMessageSizeTotal"] == str(body_bytes)
    assert float(table["putMessageAverageSize"]) == body_bytes / 4
    spread = dict(part.split(":") for part in table["putMessageDistributeTime"].split())
    assert sum(int(n) for n in spread.values()) == 2  # two puts: the send, and the batch whole
    assert int(table["putMessageEntireTimeMax"]) >= 0


def test_namesrv_deletes_a_topic_and_answers_its_config(store: Store, namesrv: WireClient) -> None:
    assert namesrv.call(RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": "T"}).code == ResponseCode.SUCCESS
    assert "T" not in store.topic_configs(refresh=True)
    config = namesrv.call(RequestCode.GET_NAMESRV_CONFIG).body.decode()
    assert re.search(r"^listenPort=\d+$", config, re.MULTILINE)
    kv = namesrv.call(RequestCode.GET_KV_CONFIG, {"namespace": "ORDER_TOPIC_CONFIG", "key": "T"})
    assert kv.code == ResponseCode.QUERY_NOT_FOUND


def test_consume_time_span_is_read_from_the_queue_and_the_groups_offsets(
    store: Store, broker: WireClient
) -> None:
    _send_known(store, {0: 3})
    OffsetStore(store, "AdmSpan").commit([("T", 0, 1)])
    response = broker.call(RequestCode.QUERY_CONSUME_TIME_SPAN, {"topic": "T", "group": "AdmSpan"})
    spans = {s["messageQueue"]["queueId"]: s for s in json.loads(response.body)["consumeTimeSpanSet"]}
    times = [
        int(r["store_ts_ms"])
        for r in store.read("consume_queue", columns=["store_ts_ms", "queue_offset"])
        .sort_by("queue_offset")
        .to_pylist()
    ]
    assert spans[0]["minTimeStamp"] == times[0] and spans[0]["maxTimeStamp"] == times[2]
    assert spans[0]["consumeTimeStamp"] == times[0] and spans[0]["delayTime"] > 0
    assert spans[1]["maxTimeStamp"] == 0 and spans[1]["delayTime"] == 0
    missing = broker.call(RequestCode.QUERY_CONSUME_TIME_SPAN, {"topic": "Nope", "group": "AdmSpan"})
    assert missing.code == ResponseCode.TOPIC_NOT_EXIST


def test_the_topic_list_names_a_topic_another_process_created_at_once(
    server: RemotingServer, namesrv: WireClient
) -> None:
    assert "T" in json.loads(namesrv.call(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER).body)["topicList"]
    Admin(Store.open(server.store.root)).create_topic("MadeElsewhere", 2)  # another Store: another process
    listed = json.loads(namesrv.call(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER).body)["topicList"]
    assert "MadeElsewhere" in listed
