"""Faults of object storage: the S3 server killed and restarted mid-commit, 503s and slow answers
injected by a proxy in front of it (a commit PUT that landed but answered 503 among them), and
readers listing and reading the tables while commits land.

The store is on SeaweedFS on 127.0.0.1 (``bench/seaweedfs.py``), the faults come from
``bench/s3proxy.py``; the producers-killed scenario on S3 is ``test_process_kills.py``'s, parametrized
over the store. As everywhere in the suite, each process fsyncs its outcomes to its own history
file and :func:`tests.fault.history.check` compares them with the store: no acknowledged message
lost, none in the logs twice, every queue's offsets dense and monotonic, everything dispatched once.
Beyond that, every error a writer or a reader saw must be typed (an ``MQError``).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.s3proxy import S3Proxy
from bench.seaweedfs import SeaweedS3
from engine import Admin, CommitStateUnknownError, Store
from engine.broker.dispatch import dispatch_pending
from engine.config import STORAGE_ENV_PREFIX
from tests.fault.history import Figures, History, check, misreported_offsets, record
from tests.fault.procs import Child, event_lines, wait_until, worker
from tests.fault.scenario import Scenario, timed
from tests.helpers import start_seaweed

pytestmark = [pytest.mark.fault, pytest.mark.s3]

TOPIC = "OBJ"
QUEUES = 4
# A Delta commit on S3: the PUT of the next ``_delta_log/<20 digits>.json``, with If-None-Match: *.
COMMIT_PUT = r"/_delta_log/\d{20}\.json$"


@pytest.fixture
def logs(tmp_path: Path) -> Path:
    return tmp_path / "logs"


def child_env(options: dict[str, str]) -> dict[str, str]:
    """What a child's environment adds to reach the store: ``MQ_STORAGE_<KEY>``, never argv."""
    return {STORAGE_ENV_PREFIX + k: v for k, v in options.items()}


def _producer(
    name: str, root: str, history_dir: Path, logs: Path, env: dict[str, str], **options: object
) -> Child:
    return worker(
        name,
        "producer",
        logs,
        env,
        store=root,
        topic=TOPIC,
        history=history_dir / f"{name}.jsonl",
        prefix=name,
        survive_errors=True,
        **options,
    )


def _writers(
    root: str, history_dir: Path, logs: Path, env: dict[str, str], tag: str = "", **options: object
) -> list[Child]:
    """Two sync senders and a batch sender, racing each other on the commit log."""
    return [
        _producer(f"sync{tag}{i}", root, history_dir, logs, env, conflict_retries=3, **options)
        for i in range(2)
    ] + [_producer(f"batch{tag}", root, history_dir, logs, env, batch=10, conflict_retries=3, **options)]


def _acknowledged_since(history_dir: Path, name: str, since: float) -> int:
    """Sends ``name`` had acknowledged after the wall-clock time ``since``."""
    path = history_dir / f"{name}.jsonl"
    count = 0
    for line in path.read_text().splitlines() if path.exists() else ():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        count += event["e"] == "acknowledged" and event["t"] > since
    return count


def _errors(outputs: list[dict[str, Any]]) -> dict[str, int]:
    """The typed errors the writers saw, by type."""
    seen: dict[str, int] = {}
    for out in outputs:
        for key, value in out.items():
            if key.startswith("error:"):
                seen[key[6:]] = seen.get(key[6:], 0) + int(value)
        if out.get("unknown"):
            seen["CommitStateUnknownError"] = seen.get("CommitStateUnknownError", 0) + int(out["unknown"])
    return seen


def _untyped(outputs: list[dict[str, Any]]) -> list[str]:
    return [e for out in outputs for e in out.get("untyped_errors", [])]


def _checked(store: Store, history_dir: Path) -> tuple[History, Figures, int]:
    _, recovery = timed(dispatch_pending, store)
    history = History.load(history_dir)
    figures = check(store, history, topics=[TOPIC], dispatched=True, recovery_s=recovery)
    return history, figures, misreported_offsets(store, history_dir, TOPIC)


# --------------------------------------------------------------------------- the server killed
@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[SeaweedS3]:
    """A SeaweedFS server of this test's own: it is killed and restarted, which the run's shared one
    must never be."""
    server = start_seaweed(tmp_path / "seaweedfs")
    yield server
    server.stop()


def test_s3_server_killed_and_restarted_mid_commit_loses_and_duplicates_nothing(
    own_server: SeaweedS3, history_dir: Path, logs: Path
) -> None:
    options = own_server.storage_options()
    root = f"s3://{own_server.create_bucket()}/store"
    store = Store.open(root, storage_options=options)
    Admin(store).create_topic(TOPIC, QUEUES)
    writers = _writers(root, history_dir, logs, child_env(options), count=100_000, size=200)
    for child in writers:
        path = history_dir / f"{child.name}.jsonl"
        wait_until(lambda path=path: event_lines(path) >= 3, 120, f"{child.name} to be sending")

    own_server.kill()  # SIGKILL: commits in flight die with it
    killed_at = time.time()
    time.sleep(4)  # down longer than object_store retries a refused connection (about 3 s)
    began = time.monotonic()
    own_server.restart()
    restarted_at, down_s = time.time(), time.time() - killed_at
    for child in writers:  # every writer resumes by itself
        wait_until(
            lambda child=child: _acknowledged_since(history_dir, child.name, restarted_at) >= 3,
            120,
            f"{child.name} to send again after the restart",
        )
    resumed_s = time.monotonic() - began
    outputs = [child.stop(timeout=180) for child in writers]

    history, figures, misreported = _checked(store, history_dir)
    errors, untyped = _errors(outputs), _untyped(outputs)
    record(
        "S3 server SIGKILLed and restarted while 3 producers commit",
        figures,
        storage="s3",
        down_s=round(down_s, 1),
        restart_to_all_sending_s=round(resumed_s, 1),
        typed_errors=errors,
        untyped_errors=len(untyped),
        stored_not_acked=figures.stored - len(history.acknowledged),
        misreported_offsets=misreported,
    )
    figures.assert_ok()
    assert untyped == [], f"writers saw untyped errors while the server was down: {untyped}"
    assert sum(errors.values()) > 0, "the writers never noticed the server was down"
    assert misreported == 0
    assert history.sent == history.acknowledged | history.gave_up


# --------------------------------------------------------------------------- injected 503s and slowness
# name -> (method, path, what the proxy does: "fail" (503 before forwarding) or "slow" (held))
INJECTED = {
    "503 on commit PUTs": ("PUT", COMMIT_PUT, "fail"),
    "503 on data-file PUTs": ("PUT", r"\.parquet$", "fail"),
    "503 on log listings and reads": ("GET", r"list-type=2|/_delta_log/|_last_checkpoint", "fail"),
    "slow commit PUTs (400 ms)": ("PUT", COMMIT_PUT, "slow"),
    "slow reads (300 ms)": ("GET", r".", "slow"),
}


@pytest.fixture
def proxy(s3_proxy: S3Proxy) -> S3Proxy:
    return s3_proxy


@pytest.mark.parametrize("fault", list(INJECTED))
def test_injected_503s_and_slow_answers_lose_and_duplicate_nothing(
    s3_server: SeaweedS3, s3_root: str, proxy: S3Proxy, history_dir: Path, logs: Path, fault: str
) -> None:
    options = s3_server.storage_options(endpoint=proxy.endpoint)
    store = Store.open(s3_root, storage_options=s3_server.storage_options())
    Admin(store).create_topic(TOPIC, QUEUES)
    writers = _writers(s3_root, history_dir, logs, child_env(options), count=30, size=200)
    method, path, kind = INJECTED[fault]
    rules: list[Any] = []
    # Re-armed every 0.5 s while the writers run, so faults fall all through their sends; only once
    # the last rule is used up, so that faults the writers have not met yet never pile up (rules
    # added faster than requests came made every retry of a slow writer meet a 503: its store could
    # not be opened in 10 retries over 16 s).
    while any(child.alive() for child in writers):
        if not rules or rules[-1].times == 0:
            if kind == "fail":
                rules.append(proxy.fail(path, method=method, status=503, times=2))
            else:
                hold = 400 if method == "PUT" else 300
                rules.append(proxy.slow(path, hold, method=method, times=3))
        time.sleep(0.5)
    proxy.clear()
    outputs = [child.finish(timeout=300) for child in writers]

    history, figures, misreported = _checked(store, history_dir)
    errors, untyped = _errors(outputs), _untyped(outputs)
    hits = sum(len(rule.hits) for rule in rules)
    record(
        f"{fault} under 3 producers (proxy in front of S3)",
        figures,
        storage="s3",
        injected=hits,
        proxied_requests=proxy.requests,
        typed_errors=errors,
        untyped_errors=len(untyped),
        sequencer_conflicts=sum(o.get("sequencer_conflicts", 0) for o in outputs),
        misreported_offsets=misreported,
    )
    figures.assert_ok()
    assert hits > 0, f"no request matched {method} {path}: the fault was never injected"
    assert untyped == [], untyped
    assert misreported == 0
    assert history.sent == history.acknowledged | history.gave_up


# A commit PUT that lands but answers 503: object_store retries it and meets 412 (the commit file
# exists). The writer reads the commit at that version and finds its own commit id there
# (engine.store.delta.commits.commit_next): the send is acknowledged once and stored once.


class _LandedScenario(Scenario):
    producer_group = "fault-landed-503"


@pytest.fixture
def landed(
    s3_server: SeaweedS3, s3_root: str, proxy: S3Proxy, history_dir: Path
) -> Iterator[_LandedScenario]:
    options = s3_server.storage_options(endpoint=proxy.endpoint)
    yield from _LandedScenario.running(s3_root, history_dir, options)


@pytest.mark.parametrize("send", ["sync send", "batch of 8"])
def test_a_commit_that_landed_but_answered_503_is_stored_once_and_acknowledged(
    landed: _LandedScenario, proxy: S3Proxy, send: str
) -> None:
    landed.send_each(4)
    rule = proxy.fail(COMMIT_PUT, method="PUT", status=503, after=True, times=1)
    outcome = "acknowledged"
    try:
        if send == "sync send":
            landed.send(1)
        else:
            landed.send_batch(8, 1)
    except CommitStateUnknownError:
        outcome = "CommitStateUnknownError"
    landed.send_each(4)  # the store goes on as before

    figures = landed.named(f"a commit PUT that landed but answered 503 ({send})").check_and_record(
        storage="s3", injected=len(rule.hits), outcome=outcome
    )
    assert len(rule.hits) == 1, "the commit PUT was never answered 503"
    assert outcome == "acknowledged", "a commit that landed was reported failed"
    assert figures.stored == figures.sent


# --------------------------------------------------------------------------- listings while commits land
def test_readers_listing_while_commits_land_never_see_a_torn_or_forked_table(
    s3_server: SeaweedS3, s3_root: str, history_dir: Path, logs: Path
) -> None:
    options = s3_server.storage_options()
    env = child_env(options)
    store = Store.open(s3_root, storage_options=options)
    Admin(store).create_topic(TOPIC, QUEUES)
    readers = [
        worker(
            f"reader{i}",
            "reader",
            logs,
            env,
            store=s3_root,
            topic=TOPIC,
            group=f"reader{i}-{uuid.uuid4().hex[:6]}",
            # every second pass: the writers commit directly now and are done within a few reader
            # passes, and each reader must have run the stats at least once
            stats_every=2,
        )
        for i in range(2)
    ]
    dispatcher = worker("dispatcher", "dispatcher", logs, env, store=s3_root, interval_ms=50)
    writers = _writers(s3_root, history_dir, logs, env, count=50, size=200)
    outputs = [child.finish(timeout=300) for child in writers]
    seen = [reader.stop(timeout=300) for reader in readers]
    dispatched = dispatcher.stop(timeout=120)

    _history, figures, misreported = _checked(store, history_dir)
    untyped = _untyped(outputs) + [e for out in seen for e in out["untyped_errors"]]
    reader_errors: dict[str, int] = {}
    for out in seen:
        for name, n in out["errors"].items():
            reader_errors[name] = reader_errors.get(name, 0) + n
    record(
        "2 readers (Store.open, reads, pulls, mq topic stats) while 3 producers and dispatch commit",
        figures,
        storage="s3",
        reader_passes=sum(out["passes"] for out in seen),
        stats_runs=sum(out["stats_runs"] for out in seen),
        pulled=sum(out["pulled"] for out in seen),
        forks=sum(out["fork_count"] for out in seen),
        torn=sum(out["torn_count"] for out in seen),
        phantoms=sum(out["phantoms"] for out in seen),
        reader_errors=reader_errors,
        writer_errors=_errors(outputs),
        untyped_errors=len(untyped),
        dispatch_passes=dispatched.get("passes"),
    )
    figures.assert_ok()
    for out in seen:
        assert out["fork_count"] == 0, out["forks"]
        assert out["torn_count"] == 0, out["torn"]
        assert out["phantoms"] == 0, "a reader pulled a message the commit log does not hold"
        assert out["passes"] >= 2 and out["stats_runs"] >= 1, out
    assert untyped == [], untyped
    assert misreported == 0
    assert sum(out["pulled"] for out in seen) > 0
