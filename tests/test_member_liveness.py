"""A member that dies on the same host drops out of its group at once (engine.client.membership
known_dead), as a RocketMQ broker notices a closed connection: its default id carries its pid
namespace and process start, so the others can tell a dead process (or a reused pid) from a live one;
any other id waits for its heartbeats to stop. A killed PushConsumer's queues are taken over long
before the member timeout."""

from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from engine import Admin, ConsumeResult, Message, Producer, PushConsumer, Store
from engine.broker.dispatch import dispatch_pending
from engine.client.membership import GroupMembership, default_consumer_id, known_dead, live_members


def _member(root: str, consumer_id: str | None, ready: Any) -> None:
    store = Store.open(root)
    cid = consumer_id or default_consumer_id()
    GroupMembership(store, "G", cid).heartbeat({"T": "*"})
    ready.put(cid)
    time.sleep(3600)


def _push(root: str, ready: Any, seen: Any) -> None:
    store = Store.open(root)
    consumer = PushConsumer(store, "PG", member_timeout_ms=120_000, heartbeat_interval_ms=1_000)
    consumer.subscribe("T")

    def listener(messages: list[Any]) -> ConsumeResult:
        for m in messages:
            seen.put((os.getpid(), m.queue_id))
        return ConsumeResult.SUCCESS

    consumer.register_listener(listener)
    consumer.start()
    ready.put(consumer.instance_id)
    time.sleep(3600)


def test_a_default_id_names_its_live_process_and_no_other() -> None:
    mine = default_consumer_id()
    host, pid, rest = mine.split("@")
    assert host == socket.gethostname() and int(pid) == os.getpid() and "." in rest
    assert not known_dead(mine)
    random_part, tag = rest.split(".")
    assert known_dead(f"{host}@{os.getpid()}@{random_part}.{tag[:8]}00000000")  # the pid, reused later
    assert known_dead(f"{host}@999999999@{random_part}.{tag}")  # no such process
    # never judged: another host, another pid namespace, an id the user chose, a malformed one
    assert not known_dead(f"elsewhere-{host}@999999999@{random_part}.{tag}")
    assert not known_dead(f"{host}@999999999@{random_part}.{'0' * 8}{tag[8:]}")
    assert not known_dead("orders-consumer-1")
    assert not known_dead(f"{host}@999999999@{random_part}")


def test_a_killed_member_leaves_the_group_at_once_and_a_chosen_id_when_its_heartbeats_age(
    tmp_path: Path,
) -> None:
    root = str(tmp_path / "mqdata")
    store = Store.open(root)
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Queue()
    procs = [
        ctx.Process(target=_member, args=(root, None, ready), daemon=True),
        ctx.Process(target=_member, args=(root, "chosen-id", ready), daemon=True),
    ]
    for p in procs:
        p.start()
    ids = {ready.get(timeout=120) for _ in procs}
    tagged = next(i for i in ids if i != "chosen-id")
    timeout = 600_000  # heartbeats stay fresh all through the test
    assert set(live_members(store, "G", timeout)) == ids
    for p in procs:
        os.kill(p.pid or 0, signal.SIGKILL)
    time.sleep(0.2)
    assert known_dead(tagged)  # killed, not yet reaped by its parent
    assert live_members(store, "G", timeout) == ["chosen-id"]
    for p in procs:
        p.join(30)
    assert known_dead(tagged)  # and once reaped
    assert live_members(store, "G", timeout) == ["chosen-id"]


def test_a_killed_push_consumers_queues_are_taken_over_long_before_its_member_timeout(tmp_path: Path) -> None:
    root = str(tmp_path / "mqdata")
    store = Store.open(root)
    Admin(store).create_topic("T", 4)
    ctx = multiprocessing.get_context("spawn")
    ready, seen = ctx.Queue(), ctx.Queue()
    procs = [ctx.Process(target=_push, args=(root, ready, seen), daemon=True) for _ in range(2)]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=120)
    owners: dict[int, int] = {}
    try:
        with Producer(store, "P") as producer:
            deadline = time.monotonic() + 120
            # both members hold two queues each (the member timeout is 2 minutes: no one is dropped)
            pids = sorted(p.pid for p in procs)
            while time.monotonic() < deadline and (len(owners) < 4 or sorted(set(owners.values())) != pids):
                producer.send_batch([Message("T", b"x") for _ in range(4)])
                dispatch_pending(store)
                while not seen.empty():
                    pid, queue_id = seen.get()
                    owners[queue_id] = pid
                time.sleep(0.3)
            assert len(owners) == 4 and len(set(owners.values())) == 2, owners
            victim = procs[0].pid
            victims_queues = {q for q, pid in owners.items() if pid == victim}
            os.kill(victim or 0, signal.SIGKILL)
            taken: set[int] = set()
            deadline = time.monotonic() + 60  # half the member timeout: only liveness can explain it
            while time.monotonic() < deadline and taken != victims_queues:
                producer.send_batch([Message("T", b"y") for _ in range(4)])
                dispatch_pending(store)
                while not seen.empty():
                    pid, queue_id = seen.get()
                    if pid != victim and queue_id in victims_queues:
                        taken.add(queue_id)
                time.sleep(0.3)
            assert taken == victims_queues
    finally:
        for p in procs:
            p.kill()
            p.join(30)


@pytest.mark.parametrize("state", ["Z", "X"])
def test_a_process_that_ended_and_waits_for_its_parent_counts_as_dead(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, state: str
) -> None:
    mine = default_consumer_id()
    real_open = open
    stat = Path(f"/proc/{os.getpid()}/stat").read_text()
    head, tail = stat.rsplit(")", 1)
    fields = tail.split()
    fields[0] = state
    fake = tmp_path / "stat"
    fake.write_text(head + ") " + " ".join(fields))

    def fake_open(path: Any, *args: Any, **kwargs: Any) -> Any:
        if str(path) == f"/proc/{os.getpid()}/stat":
            return real_open(fake, *args, **kwargs)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", fake_open)
    assert known_dead(mine)
