"""What the RocketMQ endpoint refuses: unknown codes, oversized or bad messages, missing header fields,
bad settings, a taken port, more requests than it takes at once."""

from __future__ import annotations

import threading

import pytest

from engine import Admin, Message, Producer, Store
from engine.broker.dispatch import dispatch_pending
from engine.remoting import RemotingServer
from engine.remoting.codes import PullSysFlag, RequestCode, ResponseCode
from tests.remoting.helpers import versions
from tests.remoting.wire_client import WireClient


# ----------------------------------------------------------------- refusals
def test_unknown_request_code_is_not_supported(broker: WireClient) -> None:
    response = broker.call(9999)
    assert response.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED


def test_oversized_body_is_message_illegal_and_writes_nothing(store: Store, broker: WireClient) -> None:
    before = versions(store)
    response = broker.send("T", b"x" * (4 * 1024 * 1024 + 1))
    assert response.code == ResponseCode.MESSAGE_ILLEGAL
    assert versions(store) == before


@pytest.mark.parametrize(
    ("topic", "queue_id", "props", "code"),
    [
        ("bad topic name", 0, {}, ResponseCode.MESSAGE_ILLEGAL),  # auto-creation cannot make it
        ("T", 9, {}, ResponseCode.SYSTEM_ERROR),
        ("T", 0, {"DELAY": "soon"}, ResponseCode.MESSAGE_ILLEGAL),
        ("%DLQ%x", 0, {}, ResponseCode.MESSAGE_ILLEGAL),
    ],
)
def test_bad_sends_get_rocketmq_errors_and_write_nothing(
    store: Store, broker: WireClient, topic: str, queue_id: int, props: dict[str, str], code: int
) -> None:
    before = versions(store)
    assert broker.send(topic, b"body", queue_id=queue_id, properties=props).code == code
    assert versions(store) == before


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
        probe = {"topic": "Busy", "queueId": 0}

        def park() -> threading.Thread:
            thread = threading.Thread(
                target=lambda: client.pull("G", "Busy", 0, 0, sys_flag=flags, suspend_ms=20_000, timeout=60)
            )
            thread.start()
            return thread

        # A suspended pull holds the only slot until a message arrives; the next request is refused.
        parked = park()
        response = client.call(RequestCode.GET_MAX_OFFSET, probe)
        while response.code == ResponseCode.SUCCESS:
            if not parked.is_alive():  # the probe held the slot when the pull came: park it again
                parked = park()
            response = client.call(RequestCode.GET_MAX_OFFSET, probe)
        assert response.code == ResponseCode.SYSTEM_BUSY
        with Producer(store) as producer:
            producer.send(Message("Busy", b"release"))
        dispatch_pending(store)
        parked.join(60)
        assert client.call(RequestCode.GET_MAX_OFFSET, probe).code == ResponseCode.SUCCESS
        client.close()
