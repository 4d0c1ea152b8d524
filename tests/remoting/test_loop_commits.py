"""Group commits on the event loop (engine.remoting.loop_commits): the sends a loop gathered land in one
commit, grouped as the producer's worker groups them; and the endpoint commits so on a local disk
only."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from engine import Admin, Store
from engine.client.sending import PreparedSend
from engine.config import SYNC_FLUSH, load_config
from engine.errors import ProducerClosedError
from engine.model import SendResult
from engine.remoting import RemotingServer
from engine.remoting.codes import ResponseCode
from engine.remoting.loop_commits import LOOP_LOCK_WAIT_S, REGROUP_COMMITS, LoopCommits
from engine.remoting.message_layout import BatchItem
from engine.remoting.wire_messages import IncomingMessage, incoming
from engine.remoting.wire_producer import WireProducer
from engine.store import schemas
from engine.store.commit_log import LOCK_WAIT_S, writers_host_lock
from tests.helpers import eventually, lock_waiters
from tests.remoting.wire_client import WireClient

REGROUP_MS = 60_000  # longer than any test: a commit comes from the sends, never from the timer


@pytest.fixture
def producer(store: Store) -> WireProducer:
    Admin(store).create_topic("L", 2)
    return WireProducer(store, "LAKEMQ_WIRE", linger_ms=0)


def _one(producer: WireProducer, body: bytes, queue_id: int = 0) -> tuple[PreparedSend, ...]:
    return (producer.prepare_wire(incoming("L", body, {}), queue_id),)


def _batch(producer: WireProducer, n: int, queue_id: int = 0) -> tuple[PreparedSend, ...]:
    items: list[IncomingMessage] = [incoming("L", f"b{i}".encode(), {}) for i in range(n)]
    return producer.prepare_wire_batch(items, queue_id)


def _commits(
    producer: WireProducer, *, regroup_ms: int = REGROUP_MS, batch_size: int = 1000, max_bytes: int = 1 << 30
) -> LoopCommits:
    return LoopCommits(
        producer.commit_groups, regroup_ms=regroup_ms, batch_size=batch_size, max_bytes=max_bytes
    )


def test_sends_submitted_in_one_turn_land_in_one_commit_in_order(
    store: Store, producer: WireProducer
) -> None:
    before = store.version(schemas.COMMIT_LOG)

    async def run() -> list[list[SendResult]]:
        commits = _commits(producer)
        futures = [commits.submit(_one(producer, f"m{i}".encode(), i % 2)) for i in range(5)]
        futures.append(commits.submit(_batch(producer, 3, 1)))
        results = await asyncio.gather(*futures)
        assert commits.commits == 1
        return results

    results = asyncio.run(run())
    producer.close()
    assert store.version(schemas.COMMIT_LOG) == before + 1
    assert [r[0].queue_offset for r in results[:5] if r[0].queue_id == 0] == [0, 1, 2]
    assert [r[0].queue_offset for r in results[:5] if r[0].queue_id == 1] == [0, 1]
    assert [r.queue_offset for r in results[5]] == [2, 3, 4]  # the batch, whole, after the sends before it
    assert [len(r) for r in results] == [1, 1, 1, 1, 1, 3]


def test_the_next_commit_waits_for_as_many_sends_as_the_last_one_held(
    store: Store, producer: WireProducer
) -> None:
    async def run() -> None:
        commits = _commits(producer)
        await asyncio.gather(*(commits.submit(_one(producer, b"first")) for _ in range(3)))
        assert commits.commits == 1
        early = commits.submit(_one(producer, b"early"))
        for _ in range(5):  # turns of the loop go by: one send of the three expected commits nothing
            await asyncio.sleep(0)
        assert commits.commits == 1 and not early.done()
        late = [commits.submit(_one(producer, b"late")) for _ in range(2)]
        await asyncio.gather(early, *late)  # the third one sent: committed, all three together
        assert commits.commits == 2

    before = store.version(schemas.COMMIT_LOG)
    asyncio.run(run())
    producer.close()
    assert store.version(schemas.COMMIT_LOG) == before + 2


def test_a_client_whose_threads_fell_into_two_halves_is_gathered_into_one_commit_again(
    store: Store, producer: WireProducer
) -> None:
    # Four threads of a synchronous client: once a commit held two of them (the other two were still
    # in their sockets), the next commits must not settle for two each, taking turns for ever; they
    # wait for the four the fullest recent commit held, until REGROUP_COMMITS commits held fewer.
    async def run() -> None:
        commits = _commits(producer, regroup_ms=300)
        await asyncio.gather(*(commits.submit(_one(producer, b"four")) for _ in range(4)))
        await asyncio.gather(*(commits.submit(_one(producer, b"half")) for _ in range(2)))  # timer
        assert commits.commits == 2
        half = [commits.submit(_one(producer, b"other half")) for _ in range(2)]
        for _ in range(5):
            await asyncio.sleep(0)
        assert commits.commits == 2 and not any(f.done() for f in half)  # waits for the four
        rest = [commits.submit(_one(producer, b"first half")) for _ in range(2)]
        await asyncio.gather(*half, *rest)
        assert commits.commits == 3
        for _ in range(REGROUP_COMMITS):  # a client with one thread left: waited for less and less
            await commits.submit(_one(producer, b"alone"))
        assert commits.commits == 3 + REGROUP_COMMITS
        alone = commits.submit(_one(producer, b"alone"))  # the fours are forgotten: no wait
        for _ in range(5):
            await asyncio.sleep(0)
        assert commits.commits == 4 + REGROUP_COMMITS and alone.done()

    asyncio.run(run())
    producer.close()


def test_the_regroup_wait_ends_with_fewer_sends_than_expected(store: Store, producer: WireProducer) -> None:
    async def run() -> None:
        commits = _commits(producer, regroup_ms=5)
        await asyncio.gather(*(commits.submit(_one(producer, b"first")) for _ in range(4)))
        [result] = await asyncio.wait_for(commits.submit(_one(producer, b"alone")), 30)
        assert result.queue_offset == 4 and commits.commits == 2

    asyncio.run(run())
    producer.close()


def test_a_commit_takes_at_most_batch_size_messages_and_never_splits_a_batch(
    store: Store, producer: WireProducer
) -> None:
    async def run() -> list[list[SendResult]]:
        commits = _commits(producer, batch_size=4)
        futures = [
            commits.submit(_batch(producer, 3)),
            commits.submit(_one(producer, b"fits")),  # 3 + 1: the first commit
            commits.submit(_one(producer, b"next")),  # 5 > 4: the second one
            commits.submit(_batch(producer, 5)),  # bigger than a commit alone: a commit of its own
        ]
        results = await asyncio.gather(*futures)
        assert commits.commits == 3
        return results

    before = store.version(schemas.COMMIT_LOG)
    results = asyncio.run(run())
    producer.close()
    assert store.version(schemas.COMMIT_LOG) == before + 3
    assert [r.queue_offset for group in results for r in group] == list(range(10))
    batch = [r.physical_offset for r in results[3]]
    assert batch == sorted(batch) and len(set(batch)) == 5


def test_a_commit_takes_at_most_max_bytes_of_bodies(store: Store, producer: WireProducer) -> None:
    async def run() -> None:
        commits = _commits(producer, max_bytes=10)
        futures = [commits.submit(_one(producer, b"x" * 6)) for _ in range(3)]  # 6 + 6 > 10: one each
        await asyncio.gather(*futures)
        assert commits.commits == 3

    asyncio.run(run())
    producer.close()


def test_a_failed_commit_fails_its_sends_and_stores_nothing(store: Store, producer: WireProducer) -> None:
    async def run() -> None:
        commits = _commits(producer)
        futures = [commits.submit(_one(producer, b"m")) for _ in range(2)]
        producer.close()  # before the loop's next turn, where the commit would be made
        for outcome in await asyncio.gather(*futures, return_exceptions=True):
            assert isinstance(outcome, ProducerClosedError)

    before = store.version(schemas.COMMIT_LOG)
    asyncio.run(run())
    assert store.version(schemas.COMMIT_LOG) == before


def test_a_send_whose_waiter_went_away_before_the_commit_is_left_out(
    store: Store, producer: WireProducer
) -> None:
    async def run() -> list[SendResult]:
        commits = _commits(producer)
        gone = commits.submit(_one(producer, b"gone"))
        kept = commits.submit(_one(producer, b"kept"))
        gone.cancel()
        return await kept

    [result] = asyncio.run(run())
    producer.close()
    assert result.queue_offset == 0  # the only message of the queue: the cancelled one is in no commit


def test_the_endpoint_commits_on_its_loop_on_a_local_disk(store: Store, server: RemotingServer) -> None:
    commits = server.ctx.commits
    assert commits is not None
    client = WireClient(server.broker_address)
    try:
        assert client.send("T", b"one").code == ResponseCode.SUCCESS
        batch = [BatchItem(f"b{i}".encode(), {}) for i in range(3)]
        response = client.send_batch("T", batch, queue_id=1)
        assert response.code == ResponseCode.SUCCESS and len(response.ext_fields["msgId"].split(",")) == 3
    finally:
        client.close()
    assert commits.commits == 2


def test_a_stopped_host_lock_holder_holds_the_loop_up_once_not_once_per_commit(
    store: Store, server: RemotingServer
) -> None:
    # Another writer of the host holds the commit log's lock and never lets go (a stopped process).
    holder = writers_host_lock(store, schemas.COMMIT_LOG)
    assert holder is not None and holder.acquire()
    assert server.ctx.producer.lock_wait_s == LOOP_LOCK_WAIT_S < LOCK_WAIT_S
    client = WireClient(server.broker_address)
    try:
        offsets = [client.send("T", f"m{i}".encode(), queue_id=2).ext_fields["queueOffset"] for i in range(5)]
        # one wait given up on (its waiter still queued in flock), the other commits did not wait
        assert offsets == ["0", "1", "2", "3", "4"] and lock_waiters() == 1
        holder.release()
        assert eventually(lambda: lock_waiters() == 0, timeout_s=30)  # the abandoned waiter let go
        assert client.send("T", b"locked again", queue_id=2).ext_fields["queueOffset"] == "5"
    finally:
        client.close()
        holder.close()


def test_with_sync_flush_the_endpoint_commits_through_the_producers_worker(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "synced", config=load_config(flush_disk_type=SYNC_FLUSH))
    Admin(store).create_topic("T", 2)
    before = store.version(schemas.COMMIT_LOG)
    with RemotingServer(store, namesrv_port=0, broker_port=0, run_broker_jobs=False) as srv:
        assert srv.ctx.commits is None  # fsyncs wait on the disk: not on the event loop
        client = WireClient(srv.broker_address)
        try:
            response = client.send("T", b"synced", queue_id=1)
            assert response.code == ResponseCode.SUCCESS and response.ext_fields["queueOffset"] == "0"
            batch = [BatchItem(f"b{i}".encode(), {}) for i in range(2)]
            assert client.send_batch("T", batch, queue_id=1).code == ResponseCode.SUCCESS
        finally:
            client.close()
    assert store.version(schemas.COMMIT_LOG) == before + 2
