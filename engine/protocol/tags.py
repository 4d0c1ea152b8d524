"""Tags: RocketMQ's tags code (Java's ``String.hashCode``) and TAG subscription expressions."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from functools import lru_cache

from engine.errors import InvalidArgumentError


@lru_cache(maxsize=4096)
def java_string_hashcode(s: str) -> int:
    """Java's ``String.hashCode()``: RocketMQ's tags code for a tag."""
    h = 0
    for unit in struct.unpack(f"<{len(s.encode('utf-16-le')) // 2}H", s.encode("utf-16-le")):
        h = (31 * h + unit) & 0xFFFFFFFF
    return h - (1 << 32) if h >= (1 << 31) else h


def tags_code(tags: str | None) -> int:
    """Tags code stored in a consume-queue entry (0 when the message has no tag)."""
    return java_string_hashcode(tags) if tags else 0


@dataclass(frozen=True)
class TagFilter:
    """A parsed subscription expression: ``"*"``, ``"TagA"`` or ``"TagA || TagB"``."""

    expression: str
    tags: frozenset[str]
    codes: frozenset[int]

    @property
    def matches_all(self) -> bool:
        return not self.tags

    def match_code(self, code: int) -> bool:
        """First, cheap check on the consume-queue entry's tags code (hashes may collide)."""
        return self.matches_all or code in self.codes

    def match_tag(self, tag: str | None) -> bool:
        """Second check on the stored tag string."""
        return self.matches_all or (tag is not None and tag in self.tags)


def parse_tag_expression(expression: str | None) -> TagFilter:
    """Parse a RocketMQ TAG subscription expression.

    Raises:
        InvalidArgumentError: the expression is not a string or has an empty alternative.
    """
    if expression is None:
        expression = "*"
    if not isinstance(expression, str):
        raise InvalidArgumentError("expression must be a string like '*' or 'TagA || TagB'")
    text = expression.strip()
    if text in ("", "*"):
        return TagFilter(expression, frozenset(), frozenset())
    parts = [p.strip() for p in text.split("||")]
    if any(not p for p in parts):
        raise InvalidArgumentError(
            f"expression {expression!r} has an empty tag; use '*' or 'TagA || TagB'", expression=expression
        )
    tags = frozenset(parts)
    return TagFilter(expression, tags, frozenset(java_string_hashcode(t) for t in tags))
