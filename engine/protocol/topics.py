"""Topic settings: queue counts, types and permissions a topic may have, and the broker's own topics."""

from __future__ import annotations

from dataclasses import dataclass

from engine.errors import InvalidArgumentError
from engine.protocol.names import MAX_QUEUES, SCHEDULE_TOPIC
from engine.protocol.permissions import DEFAULT_PERM, TOPIC_PERMS
from engine.protocol.schedule import SCHEDULE_QUEUES

TOPIC_TYPES = ("NORMAL", "FIFO", "DELAY", "TRANSACTION")


@dataclass(frozen=True)
class TopicConfig:
    """A topic's configuration, one row of the ``topics`` table."""

    name: str
    queues: int
    perm: int = DEFAULT_PERM  # bit flags of engine.protocol.permissions.Perm: READ | WRITE
    type: str = "NORMAL"
    created_ts_ms: int = 0


def validate_topic_settings(name: str, queues: object, type: object, perm: object) -> None:
    """Check the settings of a new topic ``name``.

    Raises:
        InvalidArgumentError: queues outside 1..1024, an unknown type, or a permission other than
            2 (write), 4 (read) or 6 (read and write).
    """
    if isinstance(queues, bool) or not isinstance(queues, int) or not 1 <= queues <= MAX_QUEUES:
        raise InvalidArgumentError(f"queues {queues!r} must be 1..{MAX_QUEUES}", topic=name, queues=queues)
    if type not in TOPIC_TYPES:
        raise InvalidArgumentError(f"type {type!r} must be one of {', '.join(TOPIC_TYPES)}", topic=name)
    if perm not in TOPIC_PERMS:
        raise InvalidArgumentError("perm must be 2 (write), 4 (read) or 6 (read and write)", topic=name)


def system_topic_queues(name: str) -> int:
    """Queues of a topic the broker creates on first use: one per delay level plus the timer queue
    for the schedule topic, one for a retry or dead-letter topic."""
    return SCHEDULE_QUEUES if name == SCHEDULE_TOPIC else 1


def system_topic_config(name: str, created_ts_ms: int) -> TopicConfig:
    """The configuration of a broker-owned topic (schedule, retry, dead letters) created at a time."""
    return TopicConfig(name, system_topic_queues(name), DEFAULT_PERM, "NORMAL", created_ts_ms)
