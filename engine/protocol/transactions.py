"""Transaction records: what half messages, decisions and check requests hold, and the check policy.

A transaction is a *half message* in ``RMQ_SYS_TRANS_HALF_TOPIC`` with its real destination in
``REAL_TOPIC`` / ``REAL_QID``, ``TRAN_MSG=true`` and the producer group in ``PGROUP``; its decision
is a commit-log row naming the half in ``TRAN_HALF_OFFSET``, committed with the app transaction
:func:`engine.store.commit_markers.transaction_app`. The producer (which decides) and the check job
(which asks, and gives up) share these rules; the reads and writes live with the store
(:mod:`engine.store.transactions`).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine.errors import InvalidArgumentError, StoreError
from engine.protocol.names import (
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TRANSACTION_PREPARED,
    TRANS_HALF_TOPIC,
)


class SysFlag(enum.IntEnum):
    """Transaction state of a commit-log row (RocketMQ ``MessageSysFlag`` transaction bits)."""

    NOT_TYPE = 0
    PREPARED = 1 << 2
    COMMIT = 2 << 2
    ROLLBACK = 3 << 2


# Rows with these flags are stored but never dispatched, and take no queue offset.
UNDISPATCHED_FLAGS: frozenset[int] = frozenset({int(SysFlag.PREPARED), int(SysFlag.ROLLBACK)})


PROPERTY_PRODUCER_GROUP = "PGROUP"
PROPERTY_HALF_OFFSET = "TRAN_HALF_OFFSET"  # physical offset of the half a decision belongs to
OP_TAG_REMOVE = "d"  # RocketMQ's op-record tag for a removed (decided) half

EVENT_CHECK = "CHECK"
EVENT_COMMIT = "COMMIT"
EVENT_ROLLBACK = "ROLLBACK"
REASON_LOCAL = "LOCAL"  # the producer's local transaction decided
REASON_CHECK = "CHECK"  # the producer's checker decided, answering a check request
REASON_MAX_CHECKS = "MAX_CHECKS"  # no decision after the maximum number of checks

DEFAULT_TIMEOUT_MS = 6_000
# A decision comes after its half, and its guard lives 7 days (the commit log's transaction
# retention) from the decision: the guard of a half younger than this cannot have expired, so its
# absence means "undecided".
GUARD_TRUSTED_MS = 6 * 24 * 3600 * 1000
DEFAULT_MAX_CHECKS = 15
DEFAULT_CHECK_INTERVAL_MS = 30_000


class LocalTransactionState(enum.StrEnum):
    """Outcome of a local transaction, as RocketMQ's ``LocalTransactionState``."""

    COMMIT = "COMMIT"
    ROLLBACK = "ROLLBACK"
    UNKNOWN = "UNKNOWN"


def guard_may_have_expired(store_ts_ms: int, now_ms: int) -> bool:
    """True when the decision guard of a half stored at ``store_ts_ms`` may be gone by ``now_ms``."""
    return now_ms - store_ts_ms > GUARD_TRUSTED_MS


@dataclass(frozen=True)
class HalfMessage:
    """A stored half message: what a decision or a check needs of it."""

    physical_offset: int
    msg_id: str
    uniq_key: str
    topic: str  # the real topic
    queue_id: int  # the real queue
    producer_group: str
    body: bytes
    tags: str | None
    keys: tuple[str, ...]
    properties: Mapping[str, str]
    born_ts_ms: int
    store_ts_ms: int

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> HalfMessage:
        """From a commit-log row of the half topic.

        Raises:
            StoreError: the row is not a half message.
        """
        props: dict[str, str] = dict(row.get("properties") or {})  # Arrow maps read as pairs
        if row["topic"] != TRANS_HALF_TOPIC or PROPERTY_REAL_TOPIC not in props:
            raise StoreError(
                f"commit-log row at {row['physical_offset']} is not a transaction half message",
                offset=row["physical_offset"],
            )
        return cls(
            physical_offset=int(row["physical_offset"]),
            msg_id=str(row["msg_id"]),
            uniq_key=str(row["uniq_key"]),
            topic=props[PROPERTY_REAL_TOPIC],
            queue_id=int(props.get(PROPERTY_REAL_QUEUE_ID, "0")),
            producer_group=props.get(PROPERTY_PRODUCER_GROUP, ""),
            body=bytes(row.get("body") or b""),  # a scan may leave bodies out
            tags=row.get("tags"),
            keys=tuple(row.get("keys") or ()),
            properties=props,
            born_ts_ms=int(row["born_ts_ms"]),
            store_ts_ms=int(row["store_ts_ms"]),
        )

    def view_row(self) -> dict[str, Any]:
        """The message as a checker sees it, as a row (``MessageExt.from_row``): real topic and queue,
        the half's offsets and id."""
        return {**vars(self), "queue_offset": -1, "sys_flag": int(SysFlag.PREPARED)}


def half_properties(
    properties: Mapping[str, str], real_topic: str, real_queue_id: int, producer_group: str
) -> dict[str, str]:
    """Properties of the half message that stands for a message bound for a real topic and queue."""
    props = dict(properties)
    props[PROPERTY_REAL_TOPIC] = real_topic
    props[PROPERTY_REAL_QUEUE_ID] = str(real_queue_id)
    props[PROPERTY_TRANSACTION_PREPARED] = "true"
    props[PROPERTY_PRODUCER_GROUP] = producer_group
    return props


def committed_properties(half: HalfMessage) -> dict[str, str]:
    """Properties of a committed half's re-put: the half's, without the half markers, naming the half."""
    props = {
        k: v
        for k, v in half.properties.items()
        if k not in (PROPERTY_REAL_TOPIC, PROPERTY_REAL_QUEUE_ID, PROPERTY_TRANSACTION_PREPARED)
    }
    props[PROPERTY_HALF_OFFSET] = str(half.physical_offset)
    return props


def rollback_properties(half: HalfMessage) -> dict[str, str]:
    """Properties of a rolled-back half's op record: the half it removes, and its producer group."""
    return {
        PROPERTY_HALF_OFFSET: str(half.physical_offset),
        PROPERTY_PRODUCER_GROUP: half.producer_group,
    }


def decides(properties: Mapping[str, str], half_physical_offset: int) -> bool:
    """True when a commit-log row with ``properties`` is the decision (re-put or op record) of the half."""
    return properties.get(PROPERTY_HALF_OFFSET) == str(int(half_physical_offset))


def transaction_record(
    half: HalfMessage,
    event: str,
    *,
    ts_ms: int,
    check_times: int = 0,
    reason: str | None = None,
    physical_offset: int | None = None,
    queue_offset: int | None = None,
) -> dict[str, Any]:
    """A row of the ``transactions`` table about ``half``.

    Args:
        half: the half message.
        event: ``EVENT_CHECK``, ``EVENT_COMMIT`` or ``EVENT_ROLLBACK``.
        ts_ms: when.
        check_times: the check number (CHECK), or the checks made before the decision.
        reason: why a decision was taken (``REASON_*``).
        physical_offset, queue_offset: where a COMMIT re-put the message.
    """
    return {
        "half_physical_offset": half.physical_offset,
        "half_msg_id": half.msg_id,
        "uniq_key": half.uniq_key,
        "producer_group": half.producer_group,
        "topic": half.topic,
        "queue_id": half.queue_id,
        "event": event,
        "check_times": check_times,
        "physical_offset": physical_offset,
        "queue_offset": queue_offset,
        "reason": reason,
        "ts_ms": ts_ms,
    }


# A half's own first-check delay in seconds (RocketMQ's MessageConst.PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS),
# set by the producer as a user property; it replaces the check job's timeout for that half.
PROPERTY_CHECK_IMMUNITY_TIME = "CHECK_IMMUNITY_TIME_IN_SECONDS"


def check_timeout_ms(properties: Mapping[str, str], default_ms: int) -> int:
    """How old a half must be before its first check: its ``CHECK_IMMUNITY_TIME_IN_SECONDS`` in
    milliseconds when that is an integer >= 0 (as RocketMQ's ``getImmunityTime``), else
    ``default_ms`` (the check job's timeout)."""
    raw = properties.get(PROPERTY_CHECK_IMMUNITY_TIME)
    if raw is None:
        return default_ms
    try:
        seconds = int(raw)
    except ValueError:
        return default_ms
    return seconds * 1000 if seconds >= 0 else default_ms


def next_check(
    check_times: int, last_check_ms: int | None, now: int, max_checks: int, check_interval_ms: int
) -> str | None:
    """What the check job does with an undecided half past its timeout.

    Returns ``EVENT_CHECK`` (ask the producer again), ``EVENT_ROLLBACK`` (asked ``max_checks`` times
    already, and the last answer is overdue) or None (the last check is younger than the interval).
    """
    if last_check_ms is not None and now - last_check_ms < check_interval_ms:
        return None
    return EVENT_ROLLBACK if check_times >= max_checks else EVENT_CHECK


def check_int(name: str, value: object, low: int) -> int:
    """``value`` when it is an int (not a bool) >= ``low``.

    Raises:
        InvalidArgumentError: anything else, naming ``name``.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise InvalidArgumentError(f"{name} {value!r} must be an int >= {low}", **{name: value})
    return value


def validate_check_settings(timeout_ms: object, max_checks: object, check_interval_ms: object) -> None:
    """Check the settings of the transaction check (ints >= 0).

    Raises:
        InvalidArgumentError: a negative or non-int setting.
    """
    check_int("timeout_ms", timeout_ms, 0)
    check_int("max_checks", max_checks, 0)
    check_int("check_interval_ms", check_interval_ms, 0)


def local_state(value: object) -> LocalTransactionState | None:
    """``value`` as a :class:`LocalTransactionState` (the enum or its name), or None if it is neither."""
    if isinstance(value, LocalTransactionState):
        return value
    if isinstance(value, str) and value in LocalTransactionState.__members__:
        return LocalTransactionState(value)
    return None
