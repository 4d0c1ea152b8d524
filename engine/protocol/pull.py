"""Pull rules: limits of one pull and RocketMQ's offset checks before a queue is read."""

from __future__ import annotations

import enum

import numpy as np

# How many consume-queue entries one pull examines at most while filtering (RocketMQ reads up to
# 16000 bytes of 20-byte entries, i.e. 800, before answering NO_MATCHED_MSG).
MAX_SCAN_ENTRIES = 800
MAX_PULL_NUMS = 1024


class PullStatus(enum.StrEnum):
    """Outcome of a pull, as RocketMQ's client-side ``PullStatus``."""

    FOUND = "FOUND"
    NO_NEW_MSG = "NO_NEW_MSG"
    NO_MATCHED_MSG = "NO_MATCHED_MSG"
    OFFSET_ILLEGAL = "OFFSET_ILLEGAL"


def pull_status(offset: int, min_offset: int, max_offset: int) -> tuple[PullStatus | None, int]:
    """RocketMQ's broker-side checks before reading: a status and next offset, or (None, offset).

    As RocketMQ's broker answers a pull: an empty queue has nothing new at offset 0 and an illegal
    offset anywhere else (corrected to 0); below the min offset is illegal (corrected to the min);
    at the max offset there is nothing new; past it is illegal (corrected to the max).
    """
    if max_offset == 0:
        return (PullStatus.NO_NEW_MSG, 0) if offset == 0 else (PullStatus.OFFSET_ILLEGAL, 0)
    if offset < min_offset:
        return PullStatus.OFFSET_ILLEGAL, min_offset
    if offset == max_offset:
        return PullStatus.NO_NEW_MSG, offset
    if offset > max_offset:
        return PullStatus.OFFSET_ILLEGAL, max_offset
    return None, offset


def batch_full(count: int, taken_bytes: int, next_size: int, max_count: int, max_bytes: int) -> bool:
    """RocketMQ's ``DefaultMessageStore.isTheBatchFull`` for one entry: whether a pull that took
    ``count`` messages of ``taken_bytes`` stops before an entry of ``next_size`` bytes (the first
    message is taken whatever its size). :func:`batch_stop` is the same rule over a window."""
    return count > 0 and (count >= max_count or taken_bytes + next_size > max_bytes)


def batch_stop(
    matched: np.ndarray, sizes: np.ndarray, max_count: int, max_bytes: int, count: int = 0, size: int = 0
) -> int:
    """Index of the first entry a pull no longer examines (``len(matched)`` when it examines all).

    RocketMQ's ``DefaultMessageStore.isTheBatchFull``, checked before each entry of the window, the
    filtered ones included: once at least one message is taken, the batch is full when it holds
    ``max_count`` messages or when the entry's size would take it past ``max_bytes``. The first
    message is taken whatever its size.

    Args:
        matched: which entries of the window the selector takes, in queue order.
        sizes: each entry's stored size in bytes (the consume queue's ``size``).
        max_count: most messages (``min(max_nums, max_transfer_count)``).
        max_bytes: most bytes (``max_transfer_bytes``).
        count, size: messages and bytes already taken before this window.
    """
    taken = matched.astype(np.int64)
    before = count + np.cumsum(taken) - taken
    bytes_before = size + np.cumsum(taken * sizes) - taken * sizes
    full = (before > 0) & ((before >= max_count) | (bytes_before + sizes > max_bytes))
    hits = np.flatnonzero(full)
    return int(hits[0]) if len(hits) else len(matched)
