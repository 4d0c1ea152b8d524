"""Unmodified ``mqadmin`` (rocketmq-tools 4.9.8, ``tests/java/mqadmin``) against ``mq serve``: every
command the README's mqadmin table marks "works" is run here, and its output is checked against what
the store holds (offsets after known sends, a group's diff after a known consume, a deleted topic gone,
a created group listed).

One server and one store serve the module; each test uses topics and groups of its own. A Java push
consumer (the harness) stays connected while the connection and running-info commands run.
"""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.java_harness import (
    Scenario,
    harness_classpath,
    mqadmin_classpath,
    mqadmin_command,
    start_scenario,
)
from bench.lakemq_server import LakemqServer
from engine import Admin, Message, Producer, PullConsumer, SendResult, Store
from engine.client.admin_offsets import committed_offsets
from engine.remoting.codes import RequestCode
from engine.remoting.context import BROKER_NAME
from engine.remoting.message_layout import offset_msg_id
from engine.remoting.wire_messages import CLUSTER_NAME
from tests.remoting.wire_client import WireClient

pytestmark = pytest.mark.slow

QUEUES = 4
_names = itertools.count()


@dataclass
class Served:
    """The server, its store, and the two class paths."""

    server: LakemqServer
    store: Store
    tools: str
    harness: str
    home: Path

    @property
    def namesrv(self) -> str:
        return self.server.namesrv

    @property
    def broker(self) -> str:
        return f"127.0.0.1:{self.server.broker_port}"

    def mqadmin(self, *args: str, timeout_s: float = 120) -> str:
        """Run one mqadmin command against the server; what it printed (stdout and stderr)."""
        self.home.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            mqadmin_command(self.tools, self.home, *args, "-n", self.namesrv),
            cwd=self.home,  # consumerStatus writes each client's running info under the working directory
            capture_output=True,
            text=True,
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
        )
        return done.stdout + done.stderr


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tools = mqadmin_classpath()
    harness = harness_classpath()
    work = tmp_path_factory.mktemp("mqadmin")
    root = work / "store"
    store = Store.open(str(root))
    with LakemqServer(root, work / "serve.log") as server:
        assert server.namesrv, server.why
        yield Served(server, store, tools, harness, work / "home")


def names() -> tuple[str, str]:
    n = next(_names)
    return f"Adm{n}Topic", f"Adm{n}Group"


def send(store: Store, topic: str, per_queue: dict[int, int]) -> list[SendResult]:
    """Known sends: ``per_queue[q]`` messages to queue ``q``."""
    results = []
    with Producer(store) as producer:
        for qid, count in per_queue.items():
            for i in range(count):
                message = Message(topic, f"{qid}-{i}".encode(), keys=(f"k{qid}-{i}",))
                results.append(producer.send(message, queue_id=qid))
    return results


def wait_dispatched(store: Store, topic: str, per_queue: dict[int, int], timeout_s: float = 60) -> None:
    """Until the server's broker loop dispatched every known send."""
    consumer = PullConsumer(store, "AdmWaiter")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(consumer.max_offset(topic, q) >= n for q, n in per_queue.items()):
            return
        time.sleep(0.2)
    pytest.fail(f"{topic} not dispatched in {timeout_s} s")


def rows(output: str, first: str) -> list[list[str]]:
    """The whitespace-split lines of ``output`` that start with ``first``."""
    return [line.split() for line in output.splitlines() if line.split()[:1] == [first]]


# ----------------------------------------------------------------- topics
def test_topic_status_prints_each_queues_offsets_from_the_store(served: Served) -> None:
    topic, _ = names()
    Admin(served.store).create_topic(topic, QUEUES)
    sent = {0: 3, 1: 0, 2: 5, 3: 1}
    send(served.store, topic, sent)
    wait_dispatched(served.store, topic, sent)
    out = served.mqadmin("topicStatus", "-t", topic)
    got = {int(r[1]): (int(r[2]), int(r[3])) for r in rows(out, BROKER_NAME)}
    assert got == {q: (0, n) for q, n in sent.items()}, out


def test_topic_status_of_an_unknown_topic_fails_with_topic_not_exist(served: Served) -> None:
    out = served.mqadmin("topicStatus", "-t", "AdmNoSuchTopic")
    assert "TOPIC_NOT_EXIST" in out or "No topic route info" in out, out


def test_update_topic_then_delete_topic_removes_it_from_topic_list_and_routes(served: Served) -> None:
    topic, _ = names()
    created = served.mqadmin("updateTopic", "-t", topic, "-c", CLUSTER_NAME, "-r", "3", "-w", "3")
    assert "create topic to" in created and "success" in created, created
    assert served.store.topic_configs(refresh=True)[topic].queues == 3
    assert topic in served.mqadmin("topicList").split()
    out = served.mqadmin("deleteTopic", "-t", topic, "-c", CLUSTER_NAME)
    assert "delete topic" in out and "success" in out, out
    assert topic not in served.mqadmin("topicList").split()
    assert topic not in served.store.topic_configs(refresh=True)


def test_delete_of_a_system_topic_is_refused_and_writes_nothing(served: Served) -> None:
    before = served.store.version("topics")
    out = served.mqadmin("deleteTopic", "-t", "SCHEDULE_TOPIC_XXXX", "-c", CLUSTER_NAME)
    assert "CODE: 1  DESC: The topic[SCHEDULE_TOPIC_XXXX] is conflict with system topic" in out, out
    assert served.store.version("topics") == before


# ----------------------------------------------------------------- groups
@pytest.fixture
def consumed(served: Served, tmp_path: Path) -> Iterator[tuple[str, str, dict[int, int], Scenario]]:
    """A topic with known sends, and a Java push consumer of a group that consumed them all and stays
    connected (its offsets are committed)."""
    topic, group = names()
    Admin(served.store).create_topic(topic, QUEUES)
    sent = {0: 2, 1: 3, 2: 1, 3: 4}
    send(served.store, topic, sent)
    wait_dispatched(served.store, topic, sent)
    consumer = start_scenario(
        served.harness, tmp_path / "java", "push", namesrv=served.namesrv, topic=topic, group=group,
        expect=sum(sent.values()), linger_ms=600_000, timeout_ms=600_000,
    )  # fmt: skip
    consumer.wait_for("started", 120)
    deadline = time.monotonic() + 120
    while committed_offsets(served.store, group, topic) != sent and time.monotonic() < deadline:
        time.sleep(0.5)
    assert committed_offsets(served.store, group, topic) == sent
    yield topic, group, sent, consumer
    consumer.proc.terminate()
    consumer.finish(30)


def test_consumer_progress_shows_the_committed_offsets_and_zero_diff(
    served: Served, consumed: tuple[str, str, dict[int, int], Scenario]
) -> None:
    topic, group, sent, _ = consumed
    out = served.mqadmin("consumerProgress", "-g", group)
    mine = {int(r[2]): (int(r[3]), int(r[4]), int(r[5])) for r in rows(out, topic)}
    assert mine == {q: (n, n, 0) for q, n in sent.items()}, out
    assert "Diff Total: 0" in out


def test_consumer_progress_counts_the_diff_of_later_sends(
    served: Served, consumed: tuple[str, str, dict[int, int], Scenario]
) -> None:
    topic, group, sent, consumer = consumed
    consumer.proc.terminate()  # stop consuming: later sends stay behind
    consumer.finish(30)
    more = {0: 2, 3: 1}
    send(served.store, topic, more)
    wait_dispatched(served.store, topic, {q: sent[q] + more.get(q, 0) for q in sent})
    out = served.mqadmin("consumerProgress", "-g", group)
    diff = {int(r[2]): int(r[5]) for r in rows(out, topic)}
    assert diff == {0: 2, 1: 0, 2: 0, 3: 1}, out
    assert "Diff Total: 3" in out


def test_consumer_connection_lists_the_running_java_consumer(
    served: Served, consumed: tuple[str, str, dict[int, int], Scenario]
) -> None:
    topic, group, _, _ = consumed
    out = served.mqadmin("consumerConnection", "-g", group)
    assert re.search(r"\d+\.\d+\.\d+\.\d+@\S+\s+\d+\.\d+\.\d+\.\d+:\d+\s+JAVA\s+V4_9_8", out), out
    assert re.search(rf"{topic}\s+\*", out), out
    assert "CONSUME_PASSIVELY" in out and "CLUSTERING" in out, out


def test_consumer_connection_of_a_group_without_members_is_not_online(served: Served) -> None:
    out = served.mqadmin("consumerConnection", "-g", "AdmNobodyGroup")
    assert "No topic route info in name server for the topic: %RETRY%AdmNobodyGroup" in out, out
    _, group = names()
    assert "success" in served.mqadmin("updateSubGroup", "-b", served.broker, "-g", group)
    out = served.mqadmin("consumerConnection", "-g", group)
    assert "CODE: 206" in out and f"the consumer group[{group}] not online" in out, out


def test_consumer_status_reports_the_clients_running_info(
    served: Served, consumed: tuple[str, str, dict[int, int], Scenario]
) -> None:
    topic, group, _, _ = consumed
    out = served.mqadmin("consumerStatus", "-g", group)
    # mqadmin asked the consumer itself (GET_CONSUMER_RUNNING_INFO forwarded): its subscription is in it
    found = re.search(r"1\s+(\d+\.\d+\.\d+\.\d+@\S+)\s+V4_9_8", out)
    assert found, out
    detail = served.mqadmin("consumerStatus", "-g", group, "-i", found.group(1))
    assert re.search(rf"Topic: {topic}\s+ClassFilter: false\s+SubExpression: \*", detail), detail
    assert "PROP_CONSUME_TYPE                       : CONSUME_PASSIVELY" in detail, detail
    assert "Same subscription in the same group of consumer" in out and "Rebalance OK" in out, out
    unknown = served.mqadmin("consumerStatus", "-g", group, "-i", "10.9.9.9@nobody")
    assert f"The Consumer <{group}> <10.9.9.9@nobody> not online" in unknown, unknown


def test_topic_route_cluster_and_broker_status(served: Served) -> None:
    topic, _ = names()
    Admin(served.store).create_topic(topic, QUEUES)
    sent = {0: 1, 1: 1}
    send(served.store, topic, sent)
    wait_dispatched(served.store, topic, sent)
    clusters = served.mqadmin("clusterList")
    assert "not supported" not in clusters, clusters
    assert re.search(
        rf"{CLUSTER_NAME}\s+{BROKER_NAME}\s+0\s+{re.escape(served.broker)}\s+V4_9_8", clusters
    ), clusters
    status = served.mqadmin("brokerStatus", "-b", served.broker)
    table = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    table = {k.strip(): v.strip() for k, v in table.items()}
    assert table["brokerVersionDesc"] == "V4_9_8", status
    assert table["putMessageTimesTotal"].isdigit(), status
    assert "[0~10ms]:" in table["putMessageDistributeTime"], status
    reader = PullConsumer(served.store, "AdmWaiter")
    configs = served.store.topic_configs(refresh=True).values()
    total = sum(reader.max_offset(c.name, q) for c in configs for q in range(c.queues))
    assert int(table["msgPutTotalTodayNow"]) == total, status


def test_stats_all_prints_the_topic_with_its_group(
    served: Served, consumed: tuple[str, str, dict[int, int], Scenario]
) -> None:
    topic, group, sent, _ = consumed
    out = served.mqadmin("statsAll", "-t", topic)
    line = [r for r in rows(out, topic) if group in r]
    assert line, out
    # accumulation 0, messages in today = what was sent, out today = what was consumed
    assert (
        int(line[0][2]) == 0
        and int(line[0][5]) == sum(sent.values())
        and int(line[0][6]) == sum(sent.values())
    ), out


def test_broker_consume_stats_lists_the_group(
    served: Served, consumed: tuple[str, str, dict[int, int], Scenario]
) -> None:
    topic, group, sent, _ = consumed
    out = served.mqadmin("brokerConsumeStats", "-b", served.broker)
    mine = {int(r[3]): int(r[5]) for r in rows(out, topic) if r[1] == group}
    assert mine == sent, out


def test_update_sub_group_creates_a_listed_group_and_delete_removes_it(served: Served) -> None:
    _, group = names()
    out = served.mqadmin("updateSubGroup", "-b", served.broker, "-g", group)
    assert "create subscription group to" in out and "success" in out, out
    assert f"%RETRY%{group}" in served.store.topic_configs(refresh=True)
    listed = served.mqadmin("consumerProgress")
    assert group in listed.split(), listed
    out = served.mqadmin("deleteSubGroup", "-b", served.broker, "-g", group)
    assert "success" in out, out
    assert f"%RETRY%{group}" not in served.store.topic_configs(refresh=True)


def test_update_sub_group_with_a_setting_lakemq_cannot_honour_is_refused(served: Served) -> None:
    _, group = names()
    before = served.store.version("topics")
    out = served.mqadmin("updateSubGroup", "-b", served.broker, "-g", group, "-s", "false")
    assert "cannot honour" in out, out
    assert served.store.version("topics") == before


def test_get_broker_config_prints_the_store_settings_and_updates_are_refused(served: Served) -> None:
    out = served.mqadmin("getBrokerConfig", "-b", served.broker)
    assert re.search(rf"defaultTopicQueueNums\s+=\s+{served.store.config.default_queues}", out), out
    assert re.search(rf"brokerName\s+=\s+{BROKER_NAME}", out), out
    refused = served.mqadmin(
        "updateBrokerConfig", "-b", served.broker, "-k", "defaultTopicQueueNums", "-v", "9"
    )
    assert "cannot change defaultTopicQueueNums" in refused, refused


def test_producer_connection_lists_a_connected_producer(served: Served) -> None:
    topic, _ = names()
    Admin(served.store).create_topic(topic, QUEUES)
    group = f"{topic}Producers"
    client = WireClient(served.broker)
    try:
        heartbeat = {
            "clientID": "10.1.2.3@adm",
            "producerDataSet": [{"groupName": group}],
            "consumerDataSet": [],
        }
        assert client.call(RequestCode.HEART_BEAT, body=json.dumps(heartbeat).encode()).code == 0
        out = served.mqadmin("producerConnection", "-g", group, "-t", topic)
        assert re.search(r"10\.1\.2\.3@adm\s+127\.0\.0\.1:\d+\s+JAVA", out), out
        table = served.mqadmin("producer", "-b", served.broker)
        assert re.search(rf"{group}.*10\.1\.2\.3@adm", table, re.DOTALL), table
    finally:
        client.close()
    out = served.mqadmin("producerConnection", "-g", group, "-t", topic)
    assert "not exist" in out, out


def test_query_msg_by_id_with_a_consumer_consumes_it_directly(
    served: Served, consumed: tuple[str, str, dict[int, int], Scenario]
) -> None:
    topic, group, _, _ = consumed
    result = send(served.store, topic, {0: 1})[0]
    msg_id = offset_msg_id("127.0.0.1", served.server.broker_port, result.physical_offset)
    client = re.search(r"(\d+\.\d+\.\d+\.\d+@\S+)", served.mqadmin("consumerConnection", "-g", group))
    assert client is not None
    out = served.mqadmin("queryMsgById", "-i", msg_id, "-g", group, "-d", client.group(1))
    assert "CR_SUCCESS" in out, out


# ----------------------------------------------------------------- messages
def test_message_look_ups_print_the_stored_messages(served: Served) -> None:
    topic, _ = names()
    Admin(served.store).create_topic(topic, 2)
    sent = {0: 2, 1: 1}
    results = send(served.store, topic, sent)
    wait_dispatched(served.store, topic, sent)
    first = results[0]
    by_offset_id = offset_msg_id("127.0.0.1", served.server.broker_port, first.physical_offset)
    out = served.mqadmin("queryMsgById", "-i", by_offset_id)
    assert re.search(rf"Topic:\s+{topic}", out) and re.search(r"Keys:\s+\[k0-0\]", out), out
    out = served.mqadmin("queryMsgByUniqueKey", "-t", topic, "-i", first.msg_id)
    assert re.search(r"Keys:\s+\[k0-0\]", out) and re.search(r"Queue Offset:\s+0", out), out
    out = served.mqadmin("queryMsgByKey", "-t", topic, "-k", "k0-1")
    assert re.search(rf"{results[1].msg_id}\s+0\s+1", out), out
    out = served.mqadmin("queryMsgByOffset", "-t", topic, "-b", BROKER_NAME, "-i", "1", "-o", "0")
    assert re.search(r"Keys:\s+\[k1-0\]", out), out
    out = served.mqadmin("printMsg", "-t", topic)
    assert out.count("MSGID:") == 3 and "minOffset=0, maxOffset=2" in out, out
    out = served.mqadmin(
        "printMsgByQueue", "-t", topic, "-a", BROKER_NAME, "-i", "0", "-p", "true", "-d", "true"
    )
    assert out.count("MSGID:") == 2, out
    out = served.mqadmin("queryCq", "-t", topic, "-q", "0", "-i", "0", "-c", "5", "-b", served.broker)
    assert "max: 2, min: 0" in out and out.count("ConsumeQueueData{") == 2, out
    assert f"physicOffset={results[1].physical_offset}," in out, out


def test_send_consume_and_send_rt_commands_go_through_the_store(served: Served) -> None:
    topic, _ = names()
    Admin(served.store).create_topic(topic, 2)
    out = served.mqadmin("sendMessage", "-t", topic, "-p", "from-mqadmin", "-b", BROKER_NAME, "-i", "1")
    assert re.search(rf"{BROKER_NAME}\s+1\s+SEND_OK", out), out
    out = served.mqadmin("checkMsgSendRT", "-t", topic, "-a", "3", "-s", "16")
    assert out.count(" true ") == 3 and "Avg RT" in out, out
    wait_dispatched(served.store, topic, {1: 1})
    bodies = [
        m.body for q in range(2) for m in PullConsumer(served.store, "AdmCheck").pull(topic, q, 0).messages
    ]
    assert bodies.count(b"from-mqadmin") == 1 and len(bodies) == 4
    out = served.mqadmin("consumeMessage", "-t", topic, "-b", BROKER_NAME, "-i", "1", "-o", "0", "-c", "1")
    assert "Consume ok" in out and "BODY: from-mqadmin" in out, out


def test_topic_commands_read_and_change_the_stored_topic(served: Served) -> None:
    topic, _ = names()
    Admin(served.store).create_topic(topic, 2)
    out = served.mqadmin("updateTopicPerm", "-t", topic, "-p", "4", "-c", CLUSTER_NAME)
    assert "update topic perm from 6 to 4" in out, out
    assert served.store.topic_configs(refresh=True)[topic].perm == 4
    route = served.mqadmin("topicRoute", "-t", topic)
    assert '"perm":4' in route and '"readQueueNums":2' in route, route
    assert served.mqadmin("topicClusterList", "-t", topic).split() == [CLUSTER_NAME]
    out = served.mqadmin("allocateMQ", "-t", topic, "-i", "10.0.0.1,10.0.0.2")
    assert f'"10.0.0.1":[{{"brokerName":"{BROKER_NAME}","queueId":0' in out, out


def test_clone_group_offset_gives_the_other_group_the_same_offsets(
    served: Served, consumed: tuple[str, str, dict[int, int], Scenario]
) -> None:
    topic, group, sent, _ = consumed
    dest = f"{group}Clone"
    out = served.mqadmin("cloneGroupOffset", "-s", group, "-d", dest, "-t", topic, "-o", "true")
    assert "clone group offset success" in out, out
    assert committed_offsets(served.store, dest, topic) == sent


def test_reset_offset_by_time_moves_the_running_consumers_group_back(
    served: Served, consumed: tuple[str, str, dict[int, int], Scenario]
) -> None:
    topic, group, sent, _ = consumed
    out = served.mqadmin("resetOffsetByTime", "-g", group, "-t", topic, "-s", "0")
    assert {int(r[1]): int(r[2]) for r in rows(out, BROKER_NAME)} == dict.fromkeys(sent, 0), out
    # the running Java consumer was told (RESET_CONSUMER_CLIENT_OFFSET): it consumes again and commits
    deadline = time.monotonic() + 120
    while committed_offsets(served.store, group, topic) != sent and time.monotonic() < deadline:
        time.sleep(0.5)
    assert committed_offsets(served.store, group, topic) == sent


def test_skip_accumulated_messages_moves_the_group_to_the_end(
    served: Served, consumed: tuple[str, str, dict[int, int], Scenario]
) -> None:
    topic, group, sent, consumer = consumed
    consumer.proc.terminate()
    consumer.finish(30)
    more = {1: 2, 2: 5}
    send(served.store, topic, more)
    ends = {q: sent[q] + more.get(q, 0) for q in sent}
    out = served.mqadmin("skipAccumulatedMessage", "-g", group, "-t", topic)
    assert {int(r[1]): int(r[2]) for r in rows(out, BROKER_NAME)} == ends, out
    assert committed_offsets(served.store, group, topic) == ends


def test_send_msg_status_sends_to_the_topic_named_after_the_broker(served: Served) -> None:
    out = served.mqadmin("sendMsgStatus", "-b", BROKER_NAME, "-s", "128", "-c", "2")
    assert out.count("sendStatus=SEND_OK") == 2, out
    # the topic was created by its first send (auto-creation through the template topic's route)
    assert served.store.topic_configs(refresh=True)[BROKER_NAME].queues >= 1


def test_config_and_export_commands(served: Served, tmp_path: Path) -> None:
    _, group = names()
    assert "success" in served.mqadmin("updateSubGroup", "-b", served.broker, "-g", group)
    out = served.mqadmin("getConsumerConfig", "-g", group)
    assert re.search(rf"groupName\s+=\s+{group}", out), out
    assert re.search(rf"retryMaxTimes\s+=\s+{served.store.config.max_reconsume_times}", out), out
    port = served.namesrv.rsplit(":", 1)[1]
    assert re.search(rf"listenPort\s+=\s+{port}", served.mqadmin("getNamesrvConfig"))
    for kind in ("Metadata", "Configs", "Metrics"):
        out = served.mqadmin(f"export{kind}", "-c", CLUSTER_NAME, "-f", str(tmp_path))
        assert "success" in out, out
    metadata = json.loads((tmp_path / "metadata.json").read_text())
    assert group in metadata["subscriptionGroupTable"]
    configs = json.loads((tmp_path / "configs.json").read_text())
    assert configs["brokerConfigs"][BROKER_NAME]["maxMessageSize"] == str(4 * 1024 * 1024)
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["evaluateReport"][BROKER_NAME]["runtimeVersion"]["rocketmqVersion"] == "V4_9_8"


REFUSED = [
    (("updateNamesrvConfig", "-k", "a", "-v", "b"), "request type 318"),
    (("updateKvConfig", "-s", "ns", "-k", "k", "-v", "v"), "request type 100"),
    (("deleteKvConfig", "-s", "ns", "-k", "k"), "request type 102"),
    (("updateOrderConf", "-t", "AdmOrder", "-m", "put", "-v", f"{BROKER_NAME}:4"), "request type 100"),
    (("wipeWritePerm", "-b", BROKER_NAME), "request type 205"),
    (("addWritePerm", "-b", BROKER_NAME), "request type 327"),
    (("cleanExpiredCQ", "-c", CLUSTER_NAME), "request type 306"),
    (("deleteExpiredCommitLog", "-c", CLUSTER_NAME), "request type 329"),
    (("cleanUnusedTopic", "-c", CLUSTER_NAME), "request type 316"),
    (("updateAclConfig", "-c", CLUSTER_NAME, "-a", "ak", "-s", "sk12345678"), "request type 50"),
    (("deleteAclConfig", "-c", CLUSTER_NAME, "-a", "ak"), "request type 51"),
    (("clusterAclConfigVersion", "-c", CLUSTER_NAME), "request type 52"),
    (("updateGlobalWhiteAddr", "-c", CLUSTER_NAME, "-g", "10.*"), "request type 53"),
]


@pytest.mark.parametrize(("args", "remark"), REFUSED, ids=[a[0] for a, _ in REFUSED])
def test_refused_commands_say_why_and_write_nothing(
    served: Served, args: tuple[str, ...], remark: str
) -> None:
    before = {name: served.store.version(name) for name in ("topics", "consumer_offset", "groups")}
    out = served.mqadmin(*args)
    assert remark in out and "CODE: 3" in out, out
    assert {name: served.store.version(name) for name in before} == before
