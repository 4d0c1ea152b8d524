"""The settings of a ``PushConsumer``, checked once: timings, batch sizes, reconsume limit, start."""

from __future__ import annotations

from dataclasses import dataclass

from engine.config import EngineConfig
from engine.errors import InvalidArgumentError
from engine.protocol.pull import MAX_PULL_NUMS
from engine.store.groups import MAX_LEASE_MS
from engine.store.store import now_ms

# RocketMQ refuses consumeThreadMin / consumeThreadMax outside 1..1000.
MAX_CONSUME_THREADS = 1000


def positive(name: str, value: object, maximum: int | None = None) -> int:
    """``value`` when it is an int > 0 (and at most ``maximum``).

    Raises:
        InvalidArgumentError: otherwise.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InvalidArgumentError(f"{name} {value!r} must be an int > 0", **{name: value})
    if maximum is not None and value > maximum:
        raise InvalidArgumentError(f"{name} {value!r} must be at most {maximum}", **{name: value})
    return value


@dataclass(frozen=True)
class PushSettings:
    """A push consumer's checked settings (see :class:`~engine.client.push.PushConsumer`)."""

    consume_from_timestamp_ms: int
    max_reconsume_setting: int  # -1: RocketMQ's default (16 concurrent, unlimited orderly)
    pull_batch_size: int
    consume_batch_size: int
    consume_thread_min: int
    consume_thread_max: int
    pull_threshold_for_queue: int
    pull_threshold_bytes_for_queue: int
    consume_concurrently_max_span: int
    consume_timeout_s: float
    await_termination_s: float
    heartbeat_s: float
    member_timeout_ms: int
    rebalance_s: float
    commit_s: float
    pull_suspend_ms: int
    lock_ttl_ms: int
    relock_s: float
    suspend_s: float


def push_settings(
    config: EngineConfig,
    *,
    consume_from_timestamp_ms: int | None,
    max_reconsume_times: int | None,
    pull_batch_size: int | None,
    consume_message_batch_max_size: int,
    consume_thread_min: int,
    consume_thread_max: int,
    pull_threshold_for_queue: int,
    pull_threshold_size_for_queue: int,
    consume_concurrently_max_span: int,
    consume_timeout: int,
    consume_timeout_ms: int | None,
    await_termination_ms_when_shutdown: int,
    heartbeat_interval_ms: int,
    member_timeout_ms: int,
    rebalance_interval_ms: int,
    commit_interval_ms: int,
    pull_suspend_ms: int,
    lock_ttl_ms: int,
    relock_interval_ms: int,
    suspend_current_queue_ms: int,
) -> PushSettings:
    """Check a push consumer's arguments.

    Raises:
        InvalidArgumentError: a bad value, naming it.
    """
    timestamp = now_ms() - 30 * 60_000 if consume_from_timestamp_ms is None else consume_from_timestamp_ms
    if isinstance(timestamp, bool) or not isinstance(timestamp, int) or timestamp < 0:
        raise InvalidArgumentError(
            "consume_from_timestamp_ms must be an epoch-millisecond int >= 0",
            consume_from_timestamp_ms=consume_from_timestamp_ms,
        )
    limit = -1 if max_reconsume_times is None else max_reconsume_times
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < -1:
        raise InvalidArgumentError(
            f"max_reconsume_times {max_reconsume_times!r} must be an int >= 0, or -1 (the default)",
            max_reconsume_times=max_reconsume_times,
        )
    heartbeat = positive("heartbeat_interval_ms", heartbeat_interval_ms)
    positive("member_timeout_ms", member_timeout_ms)
    if member_timeout_ms <= heartbeat:
        raise InvalidArgumentError(
            f"member_timeout_ms ({member_timeout_ms}) must exceed heartbeat_interval_ms ({heartbeat})",
            member_timeout_ms=member_timeout_ms,
        )
    thread_min = positive("consume_thread_min", consume_thread_min, MAX_CONSUME_THREADS)
    if positive("consume_thread_max", consume_thread_max, MAX_CONSUME_THREADS) < thread_min:
        raise InvalidArgumentError(
            f"consume_thread_max ({consume_thread_max}) must be at least consume_thread_min ({thread_min})",
            consume_thread_max=consume_thread_max,
        )
    timeout_ms = (
        positive("consume_timeout", consume_timeout) * 60_000
        if consume_timeout_ms is None
        else positive("consume_timeout_ms", consume_timeout_ms)
    )
    await_ms = await_termination_ms_when_shutdown
    if isinstance(await_ms, bool) or not isinstance(await_ms, int) or await_ms < 0:
        raise InvalidArgumentError(
            f"await_termination_ms_when_shutdown {await_ms!r} must be an int >= 0",
            await_termination_ms_when_shutdown=await_ms,
        )
    positive("lock_ttl_ms", lock_ttl_ms, MAX_LEASE_MS)
    if positive("relock_interval_ms", relock_interval_ms) * 2 >= lock_ttl_ms:
        raise InvalidArgumentError(
            f"relock_interval_ms ({relock_interval_ms}) must be under half of lock_ttl_ms "
            f"({lock_ttl_ms}), or held locks lapse between renewals",
            relock_interval_ms=relock_interval_ms,
        )
    return PushSettings(
        consume_from_timestamp_ms=timestamp,
        max_reconsume_setting=limit,
        pull_batch_size=positive(
            "pull_batch_size",
            config.pull_batch_size if pull_batch_size is None else pull_batch_size,
            MAX_PULL_NUMS,
        ),
        consume_batch_size=positive(
            "consume_message_batch_max_size", consume_message_batch_max_size, MAX_PULL_NUMS
        ),
        consume_thread_min=thread_min,
        consume_thread_max=consume_thread_max,
        # RocketMQ's bounds on the three: 1..65535, 1..1024 MiB, 1..65535.
        pull_threshold_for_queue=positive("pull_threshold_for_queue", pull_threshold_for_queue, 65_535),
        pull_threshold_bytes_for_queue=positive(
            "pull_threshold_size_for_queue", pull_threshold_size_for_queue, 1024
        )
        * 1024
        * 1024,
        consume_concurrently_max_span=positive(
            "consume_concurrently_max_span", consume_concurrently_max_span, 65_535
        ),
        consume_timeout_s=timeout_ms / 1000,
        await_termination_s=await_ms / 1000,
        heartbeat_s=heartbeat / 1000,
        member_timeout_ms=member_timeout_ms,
        rebalance_s=positive("rebalance_interval_ms", rebalance_interval_ms) / 1000,
        commit_s=positive("commit_interval_ms", commit_interval_ms) / 1000,
        pull_suspend_ms=positive("pull_suspend_ms", pull_suspend_ms),
        lock_ttl_ms=lock_ttl_ms,
        relock_s=relock_interval_ms / 1000,
        suspend_s=positive("suspend_current_queue_ms", suspend_current_queue_ms) / 1000,
    )
