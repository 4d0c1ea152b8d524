"""The syntax tree of a SQL92 message selector (RocketMQ's ``filter`` module grammar).

Nodes are frozen values built by :mod:`engine.protocol.sql92_parser` and evaluated over Arrow batches
by :mod:`engine.protocol.sql92_eval`. ``<>``, ``IS NOT NULL``, ``BETWEEN`` and ``NOT BETWEEN`` are
built from the nodes below exactly as RocketMQ builds them (``NOT (a = b)``, ``NOT (a IS NULL)``,
``a >= x AND a <= y``, ``a < x OR a > y``), so their null and type behaviour is RocketMQ's.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Kind(enum.StrEnum):
    """The Java type a value of a node has (a property is always a string, or missing)."""

    INT = "int"  # java.lang.Integer: a decimal literal within 32 bits
    LONG = "long"  # java.lang.Long: a wider decimal literal
    DOUBLE = "double"
    STRING = "string"
    BOOLEAN = "boolean"
    NULL = "null"  # always null (the NULL literal, a negated non-number)


NUMERIC_KINDS = frozenset({Kind.INT, Kind.LONG, Kind.DOUBLE})


@dataclass(frozen=True)
class Literal:
    """A constant: a string, a long or double number, TRUE, FALSE or NULL."""

    value: str | int | float | bool | None
    kind: Kind


@dataclass(frozen=True)
class Property:
    """A message property by name (``TAGS`` is the message's tag)."""

    name: str


@dataclass(frozen=True)
class Negate:
    """Unary minus: a number negated; anything else is null (RocketMQ's ``createNegate``)."""

    operand: Node


@dataclass(frozen=True)
class Not:
    """Logical NOT: unknown stays unknown."""

    operand: Node


@dataclass(frozen=True)
class BoolCast:
    """A bare property used as a condition: unknown when missing, else false (a property is a string,
    never a Boolean)."""

    operand: Property


@dataclass(frozen=True)
class Logic:
    """AND / OR with SQL's three-valued logic, short-circuited left to right as RocketMQ evaluates."""

    op: str  # "AND" or "OR"
    left: Node
    right: Node


@dataclass(frozen=True)
class Compare:
    """``=``, ``>``, ``>=``, ``<``, ``<=`` with RocketMQ's conversions between strings and numbers."""

    op: str
    left: Node
    right: Node


@dataclass(frozen=True)
class IsNull:
    """``x IS NULL``: true when ``x`` is missing."""

    operand: Node


@dataclass(frozen=True)
class In:
    """``prop [NOT] IN ('a', 'b', …)``: string membership; unknown when the property is missing."""

    operand: Property
    values: tuple[str, ...]
    negated: bool


@dataclass(frozen=True)
class StringMatch:
    """``x [NOT] CONTAINS|STARTSWITH|ENDSWITH 's'`` (RocketMQ 5): false when ``x`` is missing or not a
    string, and false for an empty ``s``."""

    op: str  # "CONTAINS", "STARTSWITH" or "ENDSWITH"
    operand: Node
    search: str
    negated: bool


Node = Literal | Property | Negate | Not | BoolCast | Logic | Compare | IsNull | In | StringMatch

BOOLEAN_NODES = (Not, BoolCast, Logic, Compare, IsNull, In, StringMatch)


def is_boolean(node: Node) -> bool:
    """Whether RocketMQ types ``node`` as a ``BooleanExpression`` (TRUE, FALSE and NULL included)."""
    if isinstance(node, Literal):
        return node.kind in (Kind.BOOLEAN, Kind.NULL)
    return isinstance(node, BOOLEAN_NODES)


def properties_of(node: Node) -> frozenset[str]:
    """Every property name the expression reads."""
    if isinstance(node, Property):
        return frozenset({node.name})
    if isinstance(node, Literal):
        return frozenset()
    if isinstance(node, Logic | Compare):
        return properties_of(node.left) | properties_of(node.right)
    return properties_of(node.operand)
