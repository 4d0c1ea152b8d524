"""The transactional producer (RocketMQ's ``TransactionMQProducer``).

``send_in_transaction`` stores a half message (invisible to consumers), runs the local transaction,
then commits the message into its real queue or rolls it back. When the local outcome is unknown
(or the producer dies before deciding), the transaction check job asks the producer group again:
a background thread of every :class:`TransactionProducer` reads the CHECK requests for its group and
answers them with the ``checker``. The records are described in :mod:`engine.protocol.transactions`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from engine.client.producer import Producer
from engine.client.sending import has_timer
from engine.errors import InvalidArgumentError, InvalidMessageError, TransactionError
from engine.model import Message, MessageExt, SendResult, SendStatus
from engine.protocol.names import TRANS_HALF_TOPIC, validate_group_name
from engine.protocol.transactions import (
    REASON_CHECK,
    REASON_LOCAL,
    HalfMessage,
    LocalTransactionState,
    local_state,
)
from engine.store import schemas
from engine.store.store import Store
from engine.store.transactions import Decision, check_floor, check_requests, is_decided, load_half

__all__ = ["LocalTransactionState", "TransactionProducer", "TransactionSendResult"]

_log = logging.getLogger(__name__)

Executor = Callable[[Message], LocalTransactionState]
Checker = Callable[[MessageExt], LocalTransactionState]


@dataclass(frozen=True)
class TransactionSendResult(SendResult):
    """A :class:`SendResult` with the local transaction's outcome.

    For COMMIT it describes the committed message in its real queue; otherwise the half message
    (topic ``RMQ_SYS_TRANS_HALF_TOPIC``, queue offset -1). ``transaction_id`` is the half's msg id.
    """

    local_state: LocalTransactionState = LocalTransactionState.UNKNOWN
    transaction_id: str = ""


def _state_of(value: object, what: str) -> LocalTransactionState:
    state = local_state(value)
    if state is not None:
        return state
    _log.warning("%s returned %r, not a LocalTransactionState; treated as UNKNOWN", what, value)
    return LocalTransactionState.UNKNOWN


MAX_CHECK_POLL_MS = 3_600_000  # an hour; longer would leave check-backs unanswered for too long


class TransactionProducer(Producer):
    """A producer that can send messages in a local transaction.

    Args:
        store: an open store.
        checker: ``checker(message) -> LocalTransactionState``: the outcome of the local transaction
            of a half message that is still undecided (called from a background thread; the message
            shows the real topic and queue, the half's msg id and offsets). An exception means UNKNOWN.
        group: the producer group; check requests go to every live producer of the group.
        check_poll_ms: how often the background thread looks for check requests.
        linger_ms, batch_size: as :class:`Producer` (for plain async sends).

    Raises:
        InvalidArgumentError: a checker that is not callable, a bad group or poll time.
    """

    def __init__(
        self,
        store: Store,
        checker: Checker,
        group: str = "DEFAULT_TX_PRODUCER",
        *,
        check_poll_ms: int = 1000,
        linger_ms: int | None = None,
        batch_size: int | None = None,
    ) -> None:
        if not callable(checker):
            raise InvalidArgumentError("checker must be callable: checker(message) -> LocalTransactionState")
        validate_group_name(group)
        if (
            isinstance(check_poll_ms, bool)
            or not isinstance(check_poll_ms, int)
            or not 1 <= check_poll_ms <= MAX_CHECK_POLL_MS
        ):
            raise InvalidArgumentError(
                f"check_poll_ms {check_poll_ms!r} must be an int in 1..{MAX_CHECK_POLL_MS}",
                check_poll_ms=check_poll_ms,
            )
        super().__init__(store, group, linger_ms=linger_ms, batch_size=batch_size)
        self._checker = checker
        self.check_poll_ms = check_poll_ms
        self._check_lock = threading.Lock()
        self._answered: set[tuple[int, int]] = set()  # (half offset, check number) already answered
        self._seen_version = -1
        self._stop = threading.Event()
        self.checks_answered = 0
        self._check_thread = threading.Thread(
            target=self._run_checks, name=f"mq-tx-check-{group}", daemon=True
        )
        self._check_thread.start()

    # ----------------------------------------------------------------- sending
    def send_in_transaction(
        self,
        message: Message,
        execute: Executor,
        queue_id: int | None = None,
        sharding_key: str | None = None,
    ) -> TransactionSendResult:
        """Send ``message`` as a half message, run ``execute(message)``, then commit or roll back.

        Args:
            message: the message (no delay or timer: transactional messages are not delayed).
            execute: the local transaction; returns COMMIT, ROLLBACK or UNKNOWN (an exception, or
                anything else, counts as UNKNOWN and leaves the decision to the check-back).
            queue_id, sharding_key: choose the real queue, as :meth:`Producer.send`.

        Returns:
            The result; ``local_state`` says what ``execute`` decided.

        Raises:
            InvalidMessageError, InvalidTopicError, TopicNotFoundError, InvalidArgumentError: bad
                input; nothing is written.
            TransactionError: the check-back had already decided the other way.
            CommitConflictError, StoreError, CommitStateUnknownError: the store refused a write (if
                after the half was stored, the check-back decides it later).
        """
        self._check_open()
        if not callable(execute):
            raise InvalidArgumentError("execute must be callable: execute(message) -> LocalTransactionState")
        if isinstance(message, Message) and (
            message.deliver_at_ms is not None
            or (isinstance(message.properties, Mapping) and has_timer(message.properties))
        ):
            raise InvalidMessageError(
                "transactional messages cannot be delayed or timed", topic=message.topic
            )
        half = self.append_half(self.prepare(message, queue_id, sharding_key), self.group)
        try:
            state = _state_of(execute(message), "execute")
        except Exception as exc:
            _log.warning("local transaction of %s raised %r; treated as UNKNOWN", half.msg_id, exc)
            state = LocalTransactionState.UNKNOWN
        if state is LocalTransactionState.UNKNOWN:
            return self._half_result(half, state)
        decision = self.end_transaction(half, state, reason=REASON_LOCAL)
        if decision.state is not state:
            raise TransactionError(
                f"transaction {half.msg_id} was already decided {decision.state} by the check-back; "
                f"the local transaction said {state}",
                msg_id=half.msg_id,
                state=decision.state,
            )
        return self._result(half, decision)

    def _half_result(self, half: HalfMessage, state: LocalTransactionState) -> TransactionSendResult:
        return TransactionSendResult(
            status=SendStatus.SEND_OK,
            msg_id=half.uniq_key,
            offset_msg_id=half.msg_id,
            topic=TRANS_HALF_TOPIC,
            queue_id=0,
            queue_offset=-1,
            physical_offset=half.physical_offset,
            local_state=state,
            transaction_id=half.msg_id,
        )

    def _result(self, half: HalfMessage, decision: Decision) -> TransactionSendResult:
        committed = decision.committed
        if committed is None:
            return self._half_result(half, decision.state)
        return TransactionSendResult(
            status=SendStatus.SEND_OK,
            msg_id=committed.uniq_key,
            offset_msg_id=committed.offset_msg_id,
            topic=committed.topic,
            queue_id=committed.queue_id,
            queue_offset=committed.queue_offset,
            physical_offset=committed.physical_offset,
            local_state=decision.state,
            transaction_id=half.msg_id,
        )

    # ----------------------------------------------------------------- check-back
    def answer_checks(self) -> int:
        """Answer the group's pending check requests now; returns how many were decided.

        The background thread calls this every ``check_poll_ms``; each request (half, check number)
        is answered once per producer.
        """
        with self._check_lock:
            latest = self._store.latest_version_hint(schemas.TRANSACTIONS, self._seen_version)
            if latest <= self._seen_version:
                return 0
            floor = check_floor(self._store)
            requests = check_requests(self._store, producer_group=self.group, floor=floor)
            pending = sorted(
                {
                    (int(po), int(n))
                    for po, n in zip(
                        requests["half_physical_offset"].to_pylist(),
                        requests["check_times"].to_pylist(),
                        strict=True,
                    )
                }
                - self._answered
            )
            decided = 0
            for po, n in pending:
                half = load_half(self._store, po)
                if half is not None and not is_decided(self._store, po, half=half):
                    decided += self._answer(half, n)
                self._answered.add((po, n))
            self._answered = {(po, n) for po, n in self._answered if po >= floor}
            self._seen_version = latest
            return decided

    def _answer(self, half: HalfMessage, check_times: int) -> int:
        try:
            state = _state_of(self._checker(MessageExt.from_row(half.view_row())), "checker")
        except Exception as exc:
            _log.warning("checker raised %r for %s; treated as UNKNOWN", exc, half.msg_id)
            state = LocalTransactionState.UNKNOWN
        self.checks_answered += 1
        if state is LocalTransactionState.UNKNOWN:
            return 0
        decision = self.end_transaction(half, state, reason=REASON_CHECK, check_times=check_times)
        return 1 if decision.won else 0

    def _run_checks(self) -> None:
        interval = self.check_poll_ms / 1000
        while not self._stop.wait(interval):
            try:
                self.answer_checks()
            except Exception as exc:  # keep polling; the requests are answered on a later round
                _log.warning("transaction check-back of group %s failed: %s", self.group, exc)

    def __enter__(self) -> TransactionProducer:
        return self

    def close(self) -> None:
        """Stop answering checks, flush async sends and stop."""
        self._stop.set()
        if self._check_thread.is_alive() and threading.current_thread() is not self._check_thread:
            self._check_thread.join(timeout=10)
        super().close()
