"""Request-reply over the wire (RocketMQ 4.7+): a request keeps what its reply needs, every message
leaves with the cluster's name, and SEND_REPLY_MESSAGE_V2 is pushed to the requester's connection
(PUSH_REPLY_MESSAGE_TO_CLIENT) and stored in the reply topic; the unmodified Java client's
``DefaultMQProducer.request`` gets its replies."""

from __future__ import annotations

import json
import threading

import pytest

from bench.java_harness import harness_classpath, run_scenario
from engine import Admin, PullConsumer, Store
from engine.remoting import RemotingServer
from engine.remoting.codes import RequestCode, ResponseCode
from engine.remoting.frames import encode_command
from engine.remoting.message_layout import decode_properties, encode_properties
from engine.remoting.wire_messages import CLUSTER_NAME, REPLY_TOPIC
from tests.remoting.wire_client import WireClient

REQUESTER = "10.0.0.9@requester"


def _register_producer(client: WireClient, client_id: str) -> None:
    body = {"clientID": client_id, "consumerDataSet": [], "producerDataSet": [{"groupName": "Requesters"}]}
    assert client.call(RequestCode.HEART_BEAT, body=json.dumps(body).encode()).code == ResponseCode.SUCCESS


def _reply(client: WireClient, properties: dict[str, str], body: bytes = b"the answer") -> tuple[int, str]:
    fields = {
        "a": "Repliers", "b": REPLY_TOPIC, "c": "TBW102", "d": 1, "e": 0, "f": 0, "g": 1_700_000_000_000,
        "h": 5, "i": encode_properties(properties), "j": 0, "k": "false",
    }  # fmt: skip
    response = client.call(RequestCode.SEND_REPLY_MESSAGE_V2, fields, body)
    return response.code, response.remark or ""


def test_a_request_keeps_its_reply_properties_and_leaves_with_the_cluster(
    server: RemotingServer, broker: WireClient
) -> None:
    asked = {"CORRELATION_ID": "c-1", "REPLY_TO_CLIENT": REQUESTER, "TTL": "3000"}
    assert broker.send("T", b"question", queue_id=0, properties=asked).code == ResponseCode.SUCCESS
    [message] = broker.pull("G", "T", 0, 0)[1]
    assert {k: message.properties[k] for k in asked} == asked
    assert message.properties["CLUSTER"] == CLUSTER_NAME


def test_a_reply_is_pushed_to_the_requesters_connection_and_stored_in_the_reply_topic(
    store: Store, server: RemotingServer, broker: WireClient
) -> None:
    requester = WireClient(server.broker_address)
    _register_producer(requester, REQUESTER)
    # The responder learns the reply topic's route (RocketMQ's broker has the topic ready).
    namesrv = WireClient(server.namesrv_address)
    assert (
        namesrv.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": REPLY_TOPIC}).code == ResponseCode.SUCCESS
    )
    namesrv.close()

    def take_the_push() -> None:
        push = requester.server_requests.get(timeout=30)
        pushed.append(push)
        requester.sock.sendall(encode_command(push.response(ResponseCode.SUCCESS)))

    pushed: list = []
    taker = threading.Thread(target=take_the_push)
    taker.start()
    reply = {"CORRELATION_ID": "c-1", "REPLY_TO_CLIENT": REQUESTER, "MSG_TYPE": "reply", "TTL": "3000"}
    assert _reply(broker, reply) == (ResponseCode.SUCCESS, "")
    taker.join(30)
    [push] = pushed
    assert push.code == RequestCode.PUSH_REPLY_MESSAGE_TO_CLIENT
    assert push.body == b"the answer"
    fields = push.ext_fields
    assert (fields["topic"], fields["flag"], fields["storeHost"]) == (REPLY_TOPIC, "5", server.broker_address)
    assert fields["bornHost"] == "{}:{}".format(*broker.address)
    properties = decode_properties(fields["properties"])
    assert properties["CORRELATION_ID"] == "c-1" and "PUSH_REPLY_TIME" in properties
    [stored] = PullConsumer(store, "audit").pull(REPLY_TOPIC, 0, 0).messages
    assert stored.body == b"the answer" and stored.properties["CORRELATION_ID"] == "c-1"
    requester.close()


@pytest.mark.parametrize(
    ("properties", "why"),
    [({"CORRELATION_ID": "c-2"}, "is null"), ({"REPLY_TO_CLIENT": "nobody@here"}, "not found")],
)
def test_a_reply_with_no_requester_to_push_to_is_a_system_error_and_still_stored(
    store: Store, server: RemotingServer, broker: WireClient, properties: dict[str, str], why: str
) -> None:
    code, remark = _reply(broker, properties)
    assert code == ResponseCode.SYSTEM_ERROR and why in remark
    assert [m.body for m in PullConsumer(store, "audit").pull(REPLY_TOPIC, 0, 0).messages] == [b"the answer"]


@pytest.mark.slow
def test_the_java_clients_request_gets_the_reply_its_responder_sent(store: Store, tmp_path) -> None:
    classpath = harness_classpath()
    Admin(store).create_topic("Questions", 4)
    with RemotingServer(store, namesrv_port=0, broker_port=0) as server:
        run = run_scenario(
            classpath, tmp_path / "client", "reply", timeout_s=300,
            namesrv=server.namesrv_address, topic="Questions", group="Answerers", count=3,
        )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert not run.of("request_failed") and not run.of("reply_failed"), run.events
    assert sorted(e["body"] for e in run.of("reply")) == ["re:ask-0", "re:ask-1", "re:ask-2"]
    requests = run.of("request")  # at least once: a rebalance may hand a request over twice
    assert {e["flag"] for e in requests} == {40, 41, 42}  # Message.flag kept
    assert all(e["cluster"] == CLUSTER_NAME for e in requests)
    # born at the requester's end of its connection, not at the broker
    broker_port = server.broker_address.rsplit(":", 1)[1]
    assert all(e["bornHost"].startswith("/127.0.0.1:") for e in requests), requests
    assert all(e["bornHost"].rsplit(":", 1)[1] != broker_port for e in requests)
