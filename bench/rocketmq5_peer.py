"""The real Apache RocketMQ 5 proxy and name server as a peer: fetched from Maven, started, stopped.

``tests/java/peer5/pom.xml`` names ``rocketmq-namesrv`` and ``rocketmq-proxy`` 5.x; the proxy runs in
LOCAL mode (``ProxyStartup -pm local``: the broker inside the proxy's process, as RocketMQ's own
``mqbroker --enable-proxy``), on free loopback ports with the store in a temporary directory, so the
5.x clients reach it at :attr:`RocketMQ5Peer.endpoint` (gRPC) as they reach lakemq's ``mq serve
--grpc``. Everything else (class path cache, process groups, ``mqadmin updateTopic``) is
:class:`~bench.rocketmq_peer.RocketMQPeer`'s.
"""

from __future__ import annotations

import json
from pathlib import Path

from bench.java_harness import JAVA_DIR, classpath_of
from bench.peers import free_port
from bench.rocketmq_peer import RocketMQPeer

PEER5_DIR = JAVA_DIR / "peer5"


def peer5_classpath() -> str:
    """The class path of the RocketMQ 5 name server and proxy (resolved with Maven once, then cached)."""
    return classpath_of(PEER5_DIR, "peer5")


class RocketMQ5Peer(RocketMQPeer):
    """A real RocketMQ 5 name server and proxy (with its broker) on loopback; a context manager.

    ``endpoint`` is the proxy's gRPC ``host:port``; ``namesrv`` and ``why`` as for RocketMQPeer."""

    def __init__(self, workdir: Path, heap_mb: int = 768) -> None:
        super().__init__(workdir, heap_mb)
        self.endpoint = ""

    def classpath(self) -> str:
        return peer5_classpath()

    def __enter__(self) -> RocketMQ5Peer:
        super().__enter__()
        return self

    def _start_broker(self, classpath: str, conf: Path, settings: dict[str, str]) -> None:
        (conf / "broker.conf").write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
        grpc_port = free_port()
        proxy = {
            "rocketMQClusterName": settings["brokerClusterName"],
            "namesrvAddr": settings["namesrvAddr"],
            "grpcServerPort": grpc_port,
            "remotingListenPort": free_port(),
            "proxyMode": "local",
        }
        (conf / "rmq-proxy.json").write_text(json.dumps(proxy))
        started = self._start(
            classpath,
            "org.apache.rocketmq.proxy.ProxyStartup",
            ["-pm", "local", "-bc", str(conf / "broker.conf"), "-pc", str(conf / "rmq-proxy.json")],
            "proxy.out",
            self.heap_mb,
        )
        self._wait_for(started, "proxy.out", "rocketmq-proxy startup successfully")
        self.endpoint = f"127.0.0.1:{grpc_port}"
