"""Pull rules: limits of one pull and RocketMQ's offset checks before a queue is read."""

from __future__ import annotations

from engine.model import PullStatus

# How many consume-queue entries one pull examines at most while filtering (RocketMQ reads up to
# 16000 bytes of 20-byte entries, i.e. 800, before answering NO_MATCHED_MSG).
MAX_SCAN_ENTRIES = 800
MAX_PULL_NUMS = 1024


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
