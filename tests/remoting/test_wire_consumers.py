"""What running wire consumers need from the broker: resets pushed to them (INVOKE_BROKER_TO_RESET_OFFSET
in, RESET_CONSUMER_CLIENT_OFFSET out, resets made in the store noticed), NOTIFY_CONSUMER_IDS_CHANGED on
every membership change, SUBSCRIPTION_NOT_EXIST for a subscription no heartbeat named, the piggybacked
offset kept when the pull arrives, topic auto-creation by default and the version the server claims."""

from __future__ import annotations

import contextlib
import json
import queue
import re
import threading
from pathlib import Path

import pytest

from engine import Admin, PullConsumer, Store
from engine.broker.dispatch import dispatch_pending
from engine.config import load_config
from engine.errors import ConfigError
from engine.remoting import RemotingServer
from engine.remoting.codes import PullSysFlag, RequestCode, ResponseCode
from engine.remoting.frames import SERVER_VERSION, RemotingCommand
from engine.remoting.reset_push import reset_offset_body
from tests.remoting.wire_client import WireClient


def _heartbeat(
    client: WireClient, client_id: str, group: str, subs: list[tuple[str, str, str]] | None = None
) -> int:
    subs = subs if subs is not None else [("T", "*", "TAG")]
    body = {
        "clientID": client_id,
        "consumerDataSet": [
            {
                "groupName": group,
                "messageModel": "CLUSTERING",
                "subscriptionDataSet": [
                    {"topic": t, "subString": e, "expressionType": k} for t, e, k in subs
                ],
            }
        ],
        "producerDataSet": [],
    }
    return client.call(RequestCode.HEART_BEAT, body=json.dumps(body).encode()).code


def _next_request(client: WireClient, code: int, timeout: float = 30) -> RemotingCommand:
    """The next request of ``code`` the server sent the client (others are skipped)."""
    while True:
        cmd = client.server_requests.get(timeout=timeout)
        if cmd.code == code:
            return cmd


def _no_request(client: WireClient, code: int, wait_s: float = 1.0) -> bool:
    """True when no request of ``code`` arrives within ``wait_s``."""
    try:
        _next_request(client, code, timeout=wait_s)
    except queue.Empty:
        return True
    return False


def _query(client: WireClient, group: str, queue_id: int) -> int:
    response = client.call(
        RequestCode.QUERY_CONSUMER_OFFSET, {"consumerGroup": group, "topic": "T", "queueId": queue_id}
    )
    assert response.code == ResponseCode.SUCCESS, response.remark
    return int(response.ext_fields["offset"])


def _report(client: WireClient, group: str, queue_id: int, offset: int) -> None:
    fields = {"consumerGroup": group, "topic": "T", "queueId": queue_id, "commitOffset": offset}
    assert client.call(RequestCode.UPDATE_CONSUMER_OFFSET, fields).code == ResponseCode.SUCCESS


def _table(body: bytes) -> dict[int, int]:
    """queue id -> offset of a ResetOffsetBody (fastjson's MessageQueue-keyed map)."""
    return {int(q): int(o) for q, o in re.findall(rb'"queueId":(\d+),"topic":"T"\}:(\d+)', body)}


# ----------------------------------------------------------------- resets
def test_reset_offset_body_is_fastjsons_messagequeue_keyed_map() -> None:
    body = reset_offset_body("b", "T", {1: 7, 0: 3})
    assert body == (
        b'{"offsetTable":{{"brokerName":"b","queueId":0,"topic":"T"}:3,'
        b'{"brokerName":"b","queueId":1,"topic":"T"}:7}}'
    )


def _consumed_three(store: Store, server: RemotingServer, broker: WireClient) -> WireClient:
    """Three messages in queue 0 of ``T``, consumed by group ``RG`` (offset 3 committed); an admin
    connection to the broker."""
    for i in range(3):
        assert broker.send("T", b"m%d" % i, queue_id=0).code == ResponseCode.SUCCESS
    dispatch_pending(store)
    assert _heartbeat(broker, "10.0.0.1@a", "RG") == ResponseCode.SUCCESS
    _report(broker, "RG", 0, 3)
    server.ctx.offsets.flush()
    admin = WireClient(server.broker_address)
    return admin


def test_invoke_reset_resets_the_store_pushes_the_reset_and_old_reports_do_not_overwrite_it(
    store: Store, server: RemotingServer, broker: WireClient
) -> None:
    admin = _consumed_three(store, server, broker)

    fields = {"topic": "T", "group": "RG", "timestamp": 0, "isForce": "true"}
    answer = admin.call(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, fields)

    assert answer.code == ResponseCode.SUCCESS, answer.remark
    assert _table(answer.body) == {0: 0, 1: 0, 2: 0, 3: 0}
    assert PullConsumer(store, "RG").committed_offset("T", 0) == 0
    pushed = _next_request(broker, RequestCode.RESET_CONSUMER_CLIENT_OFFSET)
    assert pushed.is_oneway and pushed.ext_fields["group"] == "RG" and pushed.ext_fields["topic"] == "T"
    assert _table(pushed.body) == {0: 0, 1: 0, 2: 0, 3: 0}
    # The client's periodic report still carries its old offset until it followed the reset ...
    _report(broker, "RG", 0, 3)
    broker.pull("RG", "T", 0, 3, sys_flag=int(PullSysFlag.COMMIT_OFFSET), commit_offset=3)
    server.ctx.offsets.flush()
    assert _query(broker, "RG", 0) == 0
    assert PullConsumer(store, "RG").committed_offset("T", 0) == 0
    # ... then reports the reset offset itself; from there on its progress counts again.
    _report(broker, "RG", 0, 0)
    _report(broker, "RG", 0, 2)
    server.ctx.offsets.flush()
    assert _query(broker, "RG", 0) == 2
    admin.close()


def test_a_pull_from_the_reset_offset_shows_the_client_followed_the_reset(
    store: Store, server: RemotingServer, broker: WireClient
) -> None:
    admin = _consumed_three(store, server, broker)
    fields = {"topic": "T", "group": "RG", "timestamp": 0, "isForce": "true"}
    assert admin.call(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, fields).code == ResponseCode.SUCCESS
    _next_request(broker, RequestCode.RESET_CONSUMER_CLIENT_OFFSET)
    broker.pull("RG", "T", 0, 2)  # not the reset offset: nothing shown
    _report(broker, "RG", 0, 3)
    server.ctx.offsets.flush()
    assert _query(broker, "RG", 0) == 0
    # The Java client pulls from the reset offset (0: no offset piggybacked), consumes again and
    # reports where it got to, never the reset offset itself: that report counts.
    response, messages = broker.pull("RG", "T", 0, 0)
    assert response.code == ResponseCode.SUCCESS and len(messages) == 3
    _report(broker, "RG", 0, 3)
    server.ctx.offsets.flush()
    assert _query(broker, "RG", 0) == 3
    assert PullConsumer(store, "RG").committed_offset("T", 0) == 3
    admin.close()


def test_invoke_reset_without_force_only_moves_a_queue_back(
    store: Store, server: RemotingServer, broker: WireClient
) -> None:
    for i in range(4):
        broker.send("T", b"m%d" % i, queue_id=1)
    dispatch_pending(store)
    _report(broker, "NF", 1, 1)
    server.ctx.offsets.flush()
    fields = {"topic": "T", "group": "NF", "timestamp": -1, "isForce": "false"}
    answer = broker.call(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, fields)
    assert answer.code == ResponseCode.SUCCESS
    # -1 is the max offset (4 on queue 1): ahead of the group's 1, which stays.
    assert _table(answer.body)[1] == 1
    assert PullConsumer(store, "NF").committed_offset("T", 1) == 1


def test_invoke_reset_of_a_missing_topic_is_topic_not_exist_and_pushes_nothing(
    server: RemotingServer, broker: WireClient
) -> None:
    _heartbeat(broker, "10.0.0.1@a", "MG")
    fields = {"topic": "Nope", "group": "MG", "timestamp": 0, "isForce": "true"}
    assert broker.call(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, fields).code == ResponseCode.TOPIC_NOT_EXIST
    assert _no_request(broker, RequestCode.RESET_CONSUMER_CLIENT_OFFSET)


def test_a_reset_made_in_the_store_reaches_the_groups_connected_consumers_only(
    store: Store, server: RemotingServer, broker: WireClient
) -> None:
    other = WireClient(server.broker_address)
    _heartbeat(broker, "10.0.0.1@a", "SG")
    _heartbeat(other, "10.0.0.2@b", "ElseG")

    Admin(store).reset_offset("SG", "T", 2, 0)  # what `mq group reset SG T --queue-id 2 --offset 0` runs

    pushed = _next_request(broker, RequestCode.RESET_CONSUMER_CLIENT_OFFSET)
    assert pushed.ext_fields["group"] == "SG" and _table(pushed.body) == {2: 0}
    assert _no_request(other, RequestCode.RESET_CONSUMER_CLIENT_OFFSET)
    other.close()


# ----------------------------------------------------------------- membership notifications
def test_a_dropped_connection_notifies_the_rest_of_the_group(
    server: RemotingServer, broker: WireClient
) -> None:
    other = WireClient(server.broker_address)
    _heartbeat(broker, "10.0.0.1@a", "DG")
    _heartbeat(other, "10.0.0.2@b", "DG")
    for _ in range(2):  # the joins: its own, then the other's (RocketMQ tells the joiner too)
        _next_request(broker, RequestCode.NOTIFY_CONSUMER_IDS_CHANGED)
    assert _next_request(other, RequestCode.NOTIFY_CONSUMER_IDS_CHANGED).ext_fields["consumerGroup"] == "DG"
    assert _no_request(broker, RequestCode.NOTIFY_CONSUMER_IDS_CHANGED)

    other.close()  # no UNREGISTER: the connection just drops

    note = _next_request(broker, RequestCode.NOTIFY_CONSUMER_IDS_CHANGED)
    assert note.ext_fields["consumerGroup"] == "DG"


def test_a_subscription_change_notifies_the_group(server: RemotingServer, broker: WireClient) -> None:
    other = WireClient(server.broker_address)
    _heartbeat(broker, "10.0.0.1@a", "CG2")
    _heartbeat(other, "10.0.0.2@b", "CG2")
    for _ in range(2):  # the joins: its own, then the other's
        _next_request(broker, RequestCode.NOTIFY_CONSUMER_IDS_CHANGED)
    _heartbeat(other, "10.0.0.2@b", "CG2")
    assert _no_request(broker, RequestCode.NOTIFY_CONSUMER_IDS_CHANGED)  # same subscription: quiet

    _heartbeat(other, "10.0.0.2@b", "CG2", [("T", "TagA", "TAG")])

    assert _next_request(broker, RequestCode.NOTIFY_CONSUMER_IDS_CHANGED).ext_fields["consumerGroup"] == "CG2"
    other.close()


# ----------------------------------------------------------------- subscriptions
def test_a_pull_whose_subscription_no_heartbeat_named_is_subscription_not_exist(
    store: Store, server: RemotingServer, broker: WireClient
) -> None:
    broker.send("T", b"a", queue_id=0, properties={"n": "1"})
    broker.send("T", b"b", queue_id=0, properties={"n": "9"})
    dispatch_pending(store)

    unknown_group, _ = broker.pull("SQ", "T", 0, 0, subscription=None)
    _heartbeat(broker, "10.0.0.1@a", "SQ", [("Other", "*", "TAG")])
    unknown_topic, _ = broker.pull("SQ", "T", 0, 0, subscription=None)
    _heartbeat(broker, "10.0.0.1@a", "SQ", [("T", "n > 5", "SQL92")])
    known, messages = broker.pull("SQ", "T", 0, 0, subscription=None)

    assert unknown_group.code == unknown_topic.code == ResponseCode.SUBSCRIPTION_NOT_EXIST
    assert known.code == ResponseCode.SUCCESS and [m.body for m in messages] == [b"b"]


# ----------------------------------------------------------------- offsets, topics, version
def test_the_offset_piggybacked_on_a_parked_pull_is_kept_before_the_pull_returns(
    server: RemotingServer, broker: WireClient
) -> None:
    flags = int(PullSysFlag.COMMIT_OFFSET | PullSysFlag.SUSPEND)
    other = WireClient(server.broker_address)

    def park() -> None:  # queue 3 is empty: the pull parks for up to 20 s
        # The test ends while it is parked: its answer never comes once the server stops, and the
        # wait for it must not outlive the test as an error in a thread.
        with contextlib.suppress(queue.Empty):
            broker.pull("PG", "T", 3, 0, sys_flag=flags, commit_offset=2, suspend_ms=20_000, timeout=60)

    parked = threading.Thread(target=park, daemon=True)
    parked.start()
    seen = None
    for _ in range(200):
        seen = _query(other, "PG", 3)
        if seen == 2:
            break
        threading.Event().wait(0.05)
    assert seen == 2 and parked.is_alive()
    other.close()


def test_topics_are_created_by_their_first_send_by_default_and_never_by_a_route(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "auto")
    assert store.config.auto_create_topics is True
    with RemotingServer(store, namesrv_port=0, broker_port=0, run_broker_jobs=False) as srv:
        namesrv, broker = WireClient(srv.namesrv_address), WireClient(srv.broker_address)
        # a consumer or a tool asking for a topic that does not exist learns so, and creates nothing
        route = namesrv.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "Fresh"})
        assert route.code == ResponseCode.TOPIC_NOT_EXIST
        assert "Fresh" not in store.topic_configs(refresh=True)
        # a producer sends through the template's route: the send creates it (4 queues asked, at most
        # the template's), as RocketMQ's createTopicInSendMessageMethod
        assert broker.send("Fresh", b"first", queue_id=1).code == ResponseCode.SUCCESS
        assert store.topic("Fresh").queues == min(4, store.config.default_queues)
        route = namesrv.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "Fresh"})
        assert route.code == ResponseCode.SUCCESS
        namesrv.close()
        broker.close()
    assert [m.body for m in PullConsumer(store, "g").pull("Fresh", 1, 0).messages] == [b"first"]


def test_auto_create_topics_is_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_config(auto_create_topics=False).auto_create_topics is False
    monkeypatch.setenv("MQ_AUTO_CREATE_TOPICS", "false")
    assert load_config().auto_create_topics is False
    monkeypatch.setenv("MQ_AUTO_CREATE_TOPICS", "maybe")
    with pytest.raises(ConfigError, match="true or false"):
        load_config()


def test_responses_claim_the_version_of_rocketmq_4_9_8(broker: WireClient) -> None:
    response = broker.call(RequestCode.GET_MAX_OFFSET, {"topic": "T", "queueId": 0})
    # MQVersion.Version.V4_9_8.ordinal(): what the server says it is (4.9.3 is 399).
    assert response.version == SERVER_VERSION == 409


def test_the_trace_topic_is_routed_and_sendable_but_other_system_topics_are_not(
    store: Store, server: RemotingServer, namesrv: WireClient, broker: WireClient
) -> None:
    route = namesrv.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "RMQ_SYS_TRACE_TOPIC"})
    assert route.code == ResponseCode.SUCCESS
    assert broker.send("RMQ_SYS_TRACE_TOPIC", b"Pub\x01trace").code == ResponseCode.SUCCESS
    assert broker.send("SCHEDULE_TOPIC_XXXX", b"x").code == ResponseCode.MESSAGE_ILLEGAL
    dispatch_pending(store)
    [record] = PullConsumer(store, "TraceReader").pull("RMQ_SYS_TRACE_TOPIC", 0, 0).messages
    assert record.body == b"Pub\x01trace"
