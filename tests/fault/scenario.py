"""In-process fault scenarios: a store with topic ``T`` whose producer logs every send to a history.

``test_io_errors`` and ``test_log_damage`` subclass :class:`Scenario` (the producer group, body size and
tags differ) and add their own faults; the sending, the id bookkeeping and the closing check are here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Self, TypeVar

from engine import Admin, Message, Producer, SendResult, Store
from engine.broker.dispatch import dispatch_pending
from engine.store import schemas
from tests.fault.history import Figures, HistoryLog, Storage, body_id, check, make_body, record

TOPIC = "T"
QUEUES = 2

T = TypeVar("T")


class Scenario:
    """A store at ``root`` with topic ``T`` (2 queues) and a producer whose sends are logged."""

    producer_group = "fault-scenario"
    body_size = 64
    tags: str | None = None  # of single sends (batches are untagged)

    def __init__(
        self, root: Path | str, log: HistoryLog, storage_options: dict[str, str] | None = None
    ) -> None:
        self.root = root
        self.log = log
        self.store = Store.open(root, storage_options=storage_options)
        Admin(self.store).create_topic(TOPIC, QUEUES)
        self.producer = Producer(self.store, self.producer_group)
        self.count = 0
        self.name = ""

    @classmethod
    def running(
        cls, root: Path | str, history_dir: Path, storage_options: dict[str, str] | None = None
    ) -> Iterator[Self]:
        """For a fixture to ``yield from``: the scenario with its history file open; closed after."""
        with HistoryLog(history_dir / "producer.jsonl") as log:
            scenario = cls(root, log, storage_options)
            yield scenario
            scenario.producer.close()

    def next_ids(self, n: int) -> list[str]:
        ids = [f"m{self.count + i}" for i in range(n)]
        self.count += n
        return ids

    def send(self, queue_id: int = 0, *, acknowledge: bool = True) -> SendResult:
        [mid] = self.next_ids(1)
        self.log.sent([mid])
        message = Message(TOPIC, make_body(mid, self.body_size), tags=self.tags)
        result = self.producer.send(message, queue_id=queue_id)
        if acknowledge:  # a crash before the acknowledgement reached the client leaves this out
            self.log.acknowledged([mid])
        return result

    def send_each(self, n: int) -> None:
        """``n`` single sends, to queue 0, 1, 0, 1, ..."""
        for i in range(n):
            self.send(i % QUEUES)

    def send_and_dispatch(self, n: int) -> None:
        """:meth:`send_each`, then everything pending dispatched to the consume queue."""
        self.send_each(n)
        dispatch_pending(self.store)

    def send_batch(self, n: int, queue_id: int = 0) -> list[SendResult]:
        ids = self.next_ids(n)
        self.log.sent(ids)
        results = self.producer.send_batch(
            [Message(TOPIC, make_body(m, self.body_size)) for m in ids], queue_id
        )
        self.log.acknowledged(ids)
        return results

    def log_dir(self, table: str) -> Path:
        return Path(self.store.uri(table)) / "_delta_log"

    def stored_ids(self) -> list[str]:
        rows = self.store.read(schemas.COMMIT_LOG, columns=["topic", "body"]).to_pylist()
        return [body_id(r["body"]) for r in rows if r["topic"] == TOPIC]

    def named(self, scenario: str) -> Self:
        """This scenario, under the name its figures get in FAULTS.md."""
        self.name = scenario
        return self

    def check_and_record(
        self,
        *,
        storage: Storage = "local",
        dispatched: bool = False,
        consumed: bool = False,
        recovery_s: float | None = None,
        **extra: Any,
    ) -> Figures:
        """Check the store against the history, record the figures under the scenario's name, then
        assert them (see :func:`tests.fault.history.check` for the flags)."""
        assert self.name, "name the scenario first: scenario.named(...)"
        figures = check(
            self.store,
            self.log.history,
            topics=[TOPIC],
            dispatched=dispatched,
            consumed=consumed,
            recovery_s=recovery_s,
        )
        record(self.name, figures, storage=storage, **extra)
        figures.assert_ok()
        return figures


def timed(call: Callable[..., T], *args: Any) -> tuple[T, float]:
    """``call(*args)`` and the seconds it took."""
    began = time.monotonic()
    result = call(*args)
    return result, time.monotonic() - began
