"""Topic permissions, as RocketMQ's ``PermName``: bit flags stored as an int in the ``topics`` table."""

from __future__ import annotations

import enum


class Perm(enum.IntFlag):
    """What clients may do with a topic (RocketMQ's ``PermName``)."""

    INHERIT = 1
    WRITE = 2
    READ = 4


READ_WRITE = Perm.READ | Perm.WRITE
# A new topic's permission; a plain int, as the ``topics`` table stores it.
DEFAULT_PERM: int = int(READ_WRITE)
# The permissions a topic may be created with: write only, read only, or both (a tuple, so that
# any value, hashable or not, can be looked up).
TOPIC_PERMS: tuple[Perm, ...] = (Perm.WRITE, Perm.READ, READ_WRITE)


# The bits as plain ints: ``int & Perm`` goes through IntFlag.__rand__ and builds a Perm (microseconds
# per call, on the send path of every message).
_WRITE_BIT = int(Perm.WRITE.value)
_READ_BIT = int(Perm.READ.value)


def is_writeable(perm: int) -> bool:
    """True when producers may send to a topic with ``perm``."""
    return bool(int(perm) & _WRITE_BIT)


def is_readable(perm: int) -> bool:
    """True when consumers may pull from a topic with ``perm``."""
    return bool(int(perm) & _READ_BIT)
