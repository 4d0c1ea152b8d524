"""The unmodified Apache RocketMQ 4.9.8 Java client against the endpoint: a Java producer's messages
(sync and batch) and a Python producer's reach a Java push consumer and a Java lite pull consumer,
and the Java producer's messages are pulled by a Python consumer.

The client's jars come from Maven (``mvn dependency:build-classpath``, fetched on first use); the
program is one source file run by Java 17's source launcher (tests/remoting/java_smoke/Smoke.java).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from engine import Admin, Message, Producer, PullConsumer, Store
from engine.remoting import RemotingServer

pytestmark = pytest.mark.slow

SMOKE = Path(__file__).resolve().parent / "java_smoke" / "Smoke.java"
CLIENT = "org.apache.rocketmq:rocketmq-client:4.9.8"
POM = """<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>
<groupId>lakemq</groupId><artifactId>smoke-classpath</artifactId><version>1</version>
<dependencies><dependency><groupId>org.apache.rocketmq</groupId><artifactId>rocketmq-client</artifactId>
<version>4.9.8</version></dependency></dependencies></project>"""


@pytest.fixture(scope="module")
def classpath(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The Java client's classpath, resolved once for the module's tests."""
    return client_classpath(tmp_path_factory.mktemp("maven"))


def client_classpath(work: Path) -> str:
    """The Java client's classpath, resolved by Maven (offline first, then from Maven Central)."""
    if shutil.which("java") is None or shutil.which("mvn") is None:
        pytest.skip("java and mvn are needed to run the RocketMQ Java client")
    work.mkdir(parents=True, exist_ok=True)
    (work / "pom.xml").write_text(POM)
    out = work / "cp.txt"
    for offline in (["-o"], []):
        done = subprocess.run(
            ["mvn", "-q", "-B", *offline, "dependency:build-classpath", f"-Dmdep.outputFile={out}"],
            cwd=work,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if done.returncode == 0 and out.exists():
            return out.read_text().strip()
    pytest.fail(f"could not resolve {CLIENT}: {done.stdout[-2000:]} {done.stderr[-2000:]}")


def test_java_client_produces_and_consumes_through_lakemq(store: Store, classpath: str) -> None:
    Admin(store).create_topic("JavaSmoke", 4)
    with Producer(store) as producer:
        producer.send(Message("JavaSmoke", b"from-python", tags="TagB"))
    with RemotingServer(store, namesrv_port=0, broker_port=0) as server:
        done = subprocess.run(
            ["java", "-cp", classpath, str(SMOKE), server.namesrv_address, "JavaSmoke", "6", "from-python"],
            capture_output=True,
            text=True,
            timeout=600,
        )
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert lines[-1] == "OK"
    assert sum(line.startswith("SENT SEND_OK") for line in lines) == 6
    assert "PUSHED 10 of 10" in lines and "PULLED 10 of 10" in lines
    bodies = set()
    consumer = PullConsumer(store, "PyReader")
    for queue_id in range(4):
        bodies |= {m.body for m in consumer.pull("JavaSmoke", queue_id, 0).messages}
    assert bodies == {f"smoke-{i}".encode() for i in range(6)} | {f"batch-{i}".encode() for i in range(3)} | {
        b"from-python"
    }


FEATURES = Path(__file__).resolve().parent / "java_smoke" / "Features.java"
FEATURE_CHECKS = (
    "async-send",
    "delayed-send",
    "view-message",
    "query-by-key",
    "push-and-retry",
    "orderly",
    "sql92",
    "transactions",
)


def test_java_client_features_async_delay_retry_orderly_transactions_lookups(
    store: Store, classpath: str
) -> None:
    Admin(store).create_topic("JavaFeatures", 4)
    with RemotingServer(store, namesrv_port=0, broker_port=0) as server:
        done = subprocess.run(
            ["java", "-cp", classpath, str(FEATURES), server.namesrv_address, "JavaFeatures"],
            capture_output=True,
            text=True,
            timeout=900,
        )
    checks = [line.split()[1:3] for line in done.stdout.splitlines() if line.startswith("CHECK ")]
    assert checks == [[name, "ok"] for name in FEATURE_CHECKS], done.stdout[-4000:] + done.stderr[-3000:]
    assert done.returncode == 0
    # The engine saw what the Java client did: the retry went through %RETRY%, the rollback never arrived.
    retried = PullConsumer(store, "Ops").pull("%RETRY%FeatureConsumers", 0, 0).messages
    assert [m.body for m in retried] == [b"retry-me"]
    bodies = set()
    for queue_id in range(4):
        bodies |= {
            m.body for m in PullConsumer(store, "Ops").pull("JavaFeatures", queue_id, 0, max_nums=64).messages
        }
    assert b"tx-commit" in bodies and b"tx-unknown" in bodies and b"tx-rollback" not in bodies
