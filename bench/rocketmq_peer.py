"""The real Apache RocketMQ name server and broker as a peer: fetched from Maven, started, stopped.

``tests/java/peer/pom.xml`` names ``rocketmq-namesrv`` and ``rocketmq-broker``; Maven resolves their
class path (cached like the harness's) and ``NamesrvStartup`` / ``BrokerStartup`` run with
``java -cp`` in their own process group, with a small heap (RocketMQ's own start scripts ask for
gigabytes), the store in a temporary directory and free loopback ports. The context manager stops
both (the whole process group) on exit, also on an error or Ctrl-C.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

from bench.java_harness import JAVA_DIR, HarnessError, classpath_of, java
from bench.peers import free_port, stop_process_group

PEER_DIR = JAVA_DIR / "peer"
START_TIMEOUT_S = 90.0

_LOGBACK = """<configuration>
  <appender name="FILE" class="ch.qos.logback.core.FileAppender">
    <file>{log}</file>
    <encoder><pattern>%d %-5level %logger{{20}} - %msg%n</pattern></encoder>
  </appender>
  <root level="WARN"><appender-ref ref="FILE"/></root>
</configuration>
"""


def peer_classpath() -> str:
    """The class path of the RocketMQ name server and broker (resolved with Maven once, then cached)."""
    return classpath_of(PEER_DIR, "peer")


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def broker_port() -> int:
    """A free port P whose neighbours P - 2 (the broker's VIP channel) and P + 1 (HA) are free too."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port > 1026 and all(_port_free(p) for p in (port - 2, port + 1)):
            return port
    raise HarnessError("no free port triple for the RocketMQ broker")


class RocketMQPeer:
    """A real RocketMQ name server and broker on loopback; a context manager.

    ``namesrv`` is the ``host:port`` clients use. ``why`` says why the peer is not running when
    starting failed (then ``namesrv`` is empty); the benchmark records that instead of the numbers.
    """

    def __init__(self, workdir: Path, heap_mb: int = 512) -> None:
        self.workdir = workdir
        self.heap_mb = heap_mb
        self.namesrv = ""
        self.why = ""
        self.version = ""
        self._procs: list[subprocess.Popen[bytes]] = []

    @property
    def pids(self) -> list[int]:
        """The name server's and the broker's processes (JVMs) started so far."""
        return [p.pid for p in self._procs]

    def classpath(self) -> str:
        """The class path of the servers and of ``mqadmin`` (rocketmq-tools comes with the broker)."""
        return peer_classpath()

    def _start(
        self, classpath: str, main: str, args: list[str], log: str, heap_mb: int
    ) -> subprocess.Popen[bytes]:
        env = {**os.environ, "ROCKETMQ_HOME": str(self.workdir)}
        cmd = [
            java(),
            f"-Xms{heap_mb}m",
            f"-Xmx{heap_mb}m",
            "-XX:+UseSerialGC",
            f"-XX:MaxDirectMemorySize={heap_mb}m",
            f"-Duser.home={self.workdir}",
            f"-Drocketmq.home.dir={self.workdir}",
            "-cp",
            classpath,
            main,
            *args,
        ]
        out = (self.workdir / log).open("wb")
        proc = subprocess.Popen(
            cmd,
            cwd=self.workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        out.close()
        self._procs.append(proc)
        return proc

    def _wait_for(self, proc: subprocess.Popen[bytes], log: str, line: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        path = self.workdir / log
        while time.monotonic() < deadline:
            if line in path.read_text(errors="replace"):
                return
            if proc.poll() is not None:
                break
            time.sleep(0.2)
        tail = path.read_text(errors="replace")[-2000:]
        raise HarnessError(f"{log} did not report {line!r} (exit code {proc.poll()}):\n{tail}")

    def __enter__(self) -> RocketMQPeer:
        try:
            classpath = self.classpath()
            self.version = next(
                (
                    p.split("rocketmq-broker-")[1].removesuffix(".jar")
                    for p in classpath.split(os.pathsep)
                    if "rocketmq-broker-" in p
                ),
                "unknown",
            )
            conf = self.workdir / "conf"
            conf.mkdir(parents=True, exist_ok=True)
            for name in ("namesrv", "broker", "tools"):
                (conf / f"logback_{name}.xml").write_text(
                    _LOGBACK.format(log=self.workdir / f"{name}-logback.log")
                )
            ns_port = free_port()
            (conf / "namesrv.properties").write_text(f"listenPort={ns_port}\n")
            namesrv = self._start(
                classpath,
                "org.apache.rocketmq.namesrv.NamesrvStartup",
                ["-c", str(conf / "namesrv.properties")],
                "namesrv.out",
                256,
            )
            self._wait_for(namesrv, "namesrv.out", "boot success")
            self._start_broker(classpath, conf, self._broker_settings(ns_port))
            self.namesrv = f"127.0.0.1:{ns_port}"
        except (HarnessError, OSError, subprocess.SubprocessError) as exc:
            self.why = str(exc)
            self.stop()
        return self

    def _broker_settings(self, ns_port: int) -> dict[str, str]:
        """The broker's configuration (broker.conf)."""
        store = self.workdir / "store"
        return {
            "brokerClusterName": "BenchCluster",
            "brokerName": "broker-a",
            "brokerId": "0",
            "listenPort": str(broker_port()),
            "brokerIP1": "127.0.0.1",
            "namesrvAddr": f"127.0.0.1:{ns_port}",
            "storePathRootDir": str(store),
            "storePathCommitLog": str(store / "commitlog"),
            "autoCreateTopicEnable": "true",
            "autoCreateSubscriptionGroup": "true",
            "flushDiskType": "ASYNC_FLUSH",
            "brokerRole": "ASYNC_MASTER",
            "mappedFileSizeCommitLog": str(128 * 1024 * 1024),
            "diskMaxUsedSpaceRatio": "95",
            "transactionTimeOut": "1000",
            "transactionCheckInterval": "1000",
            # a send waiting longer than this in the broker's queue is refused (flow control,
            # SYSTEM_BUSY); the default 200 ms trips on a shared 2-core machine
            "waitTimeMillsInSendQueue": "1000",
        }

    def _start_broker(self, classpath: str, conf: Path, settings: dict[str, str]) -> None:
        """Start the broker with ``settings`` and wait for its "boot success"."""
        (conf / "broker.conf").write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
        broker = self._start(
            classpath,
            "org.apache.rocketmq.broker.BrokerStartup",
            ["-c", str(conf / "broker.conf")],
            "broker.out",
            self.heap_mb,
        )
        self._wait_for(broker, "broker.out", "boot success")

    def create_topic(self, topic: str, queues: int) -> None:
        """Create a topic with ``queues`` read and write queues (RocketMQ's ``mqadmin updateTopic``)."""
        cmd = [
            java(), "-Xmx128m", "-XX:+UseSerialGC", f"-Duser.home={self.workdir}",
            f"-Drocketmq.home.dir={self.workdir}", "-cp", self.classpath(),
            "org.apache.rocketmq.tools.command.MQAdminStartup", "updateTopic",
            "-n", self.namesrv, "-c", "BenchCluster", "-t", topic, "-r", str(queues), "-w", str(queues),
        ]  # fmt: skip
        done = subprocess.run(
            cmd, env={**os.environ, "ROCKETMQ_HOME": str(self.workdir)}, stdin=subprocess.DEVNULL,
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        if done.returncode != 0 or "success" not in done.stdout:
            raise HarnessError(f"updateTopic {topic} failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")

    def stop(self) -> None:
        """Stop the broker, then the name server: SIGTERM to each process group, SIGKILL after 15 s."""
        for proc in reversed(self._procs):
            stop_process_group(proc)
        self._procs.clear()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
