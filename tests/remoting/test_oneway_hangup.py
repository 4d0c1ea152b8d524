"""One-way requests are carried out even when the client hangs up right after sending them, as
RocketMQ's broker does (a Java producer's ``sendOneway`` before ``shutdown``, the offset commit a
consumer sends as it shuts down)."""

from __future__ import annotations

import time
from pathlib import Path

from engine import Admin, MessageExt, PullConsumer, Store
from engine.broker.dispatch import dispatch_pending
from engine.remoting import RemotingServer
from engine.remoting.codes import RequestCode
from engine.remoting.message_layout import encode_properties
from tests.remoting.wire_client import WireClient


def test_one_way_sends_are_stored_when_the_client_closes_its_connection_at_once(tmp_path: Path) -> None:
    store = Store.open(str(tmp_path / "store"))
    Admin(store).create_topic("T", 4)
    with RemotingServer(store, namesrv_port=0, broker_port=0, run_broker_jobs=False) as server:
        client = WireClient(server.broker_address)
        for i in range(20):
            fields = {
                "producerGroup": "OnewayProducers", "topic": "T", "defaultTopic": "TBW102",
                "defaultTopicQueueNums": 4, "queueId": 0, "sysFlag": 0, "bornTimestamp": 0, "flag": 0,
                "properties": encode_properties({"KEYS": f"k{i}"}), "reconsumeTimes": 0, "unitMode": "false",
            }  # fmt: skip
            client.request(RequestCode.SEND_MESSAGE, fields, f"m{i}".encode(), oneway=True)
        client.close()  # hang up with the sends still queued on the server
        pulled = _stored(store, 20)
    assert sorted(m.body for m in pulled) == sorted(f"m{i}".encode() for i in range(20))


def _stored(store: Store, count: int) -> list[MessageExt]:
    """Queue 0's messages once ``count`` are there, or what is there after 30 s."""
    deadline = time.monotonic() + 30
    while True:
        dispatch_pending(store)
        pulled = PullConsumer(store, "OnewayReader").pull("T", 0, 0, max_nums=32).messages
        if len(pulled) >= count or time.monotonic() > deadline:
            return pulled
        time.sleep(0.1)
