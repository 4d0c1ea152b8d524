"""Vectorised evaluation of a SQL92 selector over a batch of messages (pyarrow.compute, no Python loop
over rows).

Semantics are RocketMQ's broker (``filter/expression/*``), where message properties are strings:

- Three-valued logic: a missing property is NULL; ``=``, ``>``, … on NULL are unknown, ``AND`` /
  ``OR`` / ``NOT`` follow SQL's (Kleene) rules, and a message matches only when the whole expression
  is TRUE ("unknown is false").
- Types: a property compared with a number is converted as Java does (``Integer.valueOf`` for a 32-bit
  literal, ``Long.valueOf`` for a wider one, ``Double.valueOf`` for a floating literal; two properties
  are compared as doubles by ``>``/``<``); compared with TRUE/FALSE it is true when it equals ``"true"``
  ignoring case. A conversion that fails (``amount > 5`` with ``amount = 'abc'`` or ``'5.5'``) makes
  RocketMQ's evaluation throw, and a message whose evaluation throws does not match, whatever the rest
  of the expression says (``NOT (amount > 5)`` does not match either). That is kept as a fourth state,
  ERROR, propagated as RocketMQ's left-to-right short-circuit evaluation would: ``x = 'y' OR amount > 5``
  matches when ``x = 'y'`` even if ``amount`` is not a number.
- ``x = y`` with both missing is TRUE; missing on the left only is unknown, on the right only FALSE.

Not reproduced: Java's hexadecimal floating strings (``'0x1p3'``) and non-ASCII digits are treated as
non-numbers, and ``-0.0`` equals ``0.0``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from engine.protocol.sql92_ast import (
    NUMERIC_KINDS,
    BoolCast,
    Compare,
    In,
    IsNull,
    Kind,
    Literal,
    Logic,
    Negate,
    Node,
    Not,
    Property,
    StringMatch,
)

Datum = Any  # a pyarrow Array or Scalar: pyarrow.compute broadcasts scalars against arrays
Lookup = Callable[[str], pa.Array]  # property name -> string array (null where the message lacks it)

_NULL_BOOL = pa.scalar(None, pa.bool_())
_DEC = pa.decimal128(38, 0)
_INTEGRAL = r"^[+-]?[0-9]+$"
_JAVA_DOUBLE = r"^[+-]?(NaN|Infinity|([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?[fFdD]?)$"
_JAVA_TRIM = "".join(chr(c) for c in range(33))  # String.trim(): every char <= ' '
_RANGES = {Kind.INT: (-(2**31), 2**31 - 1), Kind.LONG: (-(2**63), 2**63 - 1)}
_WIDER = {Kind.INT: 0, Kind.LONG: 1, Kind.DOUBLE: 2}


@dataclass(frozen=True)
class Value:
    """What a node evaluates to: a Java kind, the values, and the rows whose evaluation threw."""

    kind: Kind
    data: Datum
    error: Datum | None = None


def _or(a: Datum | None, b: Datum | None) -> Datum | None:
    if a is None:
        return b
    if b is None:
        return a
    return pc.or_(a, b)


def _and_not_null(mask: Datum | None, valid: Datum) -> Datum | None:
    return None if mask is None else pc.and_(mask, valid)


def _valid(v: Value) -> Datum:
    return pa.scalar(False) if v.kind is Kind.NULL else pc.is_valid(v.data)


# ---------------------------------------------------------------------- Java's string conversions
def _parse_integral(s: Datum, kind: Kind) -> tuple[Datum, Datum]:
    """``Integer.valueOf`` / ``Long.valueOf`` of strings: int64 values and where parsing failed."""
    lo, hi = _RANGES[kind]
    ok = pc.fill_null(pc.match_substring_regex(s, _INTEGRAL), False)
    length = pc.utf8_length(s)
    if pc.all(pc.or_(pc.invert(ok), pc.less_equal(length, 18))).as_py() is not False:
        # Common case: at most 18 characters always fit in a long; a leading '+' is Java's, not Arrow's.
        values = pc.cast(pc.if_else(ok, pc.utf8_ltrim(s, characters="+"), "0"), pa.int64())
    else:  # long digit strings (leading zeros, or past a long): exact range checks in decimal
        digits = pc.replace_substring_regex(pc.utf8_ltrim(s, characters="+"), r"^(-?)0+([0-9])", r"\1\2")
        ok = pc.and_(ok, pc.fill_null(pc.less_equal(pc.utf8_length(digits), 20), False))
        number = pc.cast(pc.if_else(ok, digits, "0"), _DEC)
        fits = pc.and_(
            pc.greater_equal(number, pa.scalar(-(2**63), _DEC)),
            pc.less_equal(number, pa.scalar(2**63 - 1, _DEC)),
        )
        ok = pc.and_(ok, pc.fill_null(fits, False))
        values = pc.cast(pc.if_else(ok, number, pa.scalar(0, _DEC)), pa.int64())
    if kind is Kind.INT:
        ok = pc.and_(ok, pc.and_(pc.greater_equal(values, lo), pc.less_equal(values, hi)))
    return values, pc.and_(pc.is_valid(s), pc.invert(ok))


def _parse_double(s: Datum) -> tuple[Datum, Datum]:
    """``Double.valueOf`` of strings (trimmed, optional f/d suffix, NaN, Infinity)."""
    trimmed = pc.utf8_trim(s, characters=_JAVA_TRIM)
    ok = pc.fill_null(pc.match_substring_regex(trimmed, _JAVA_DOUBLE), False)
    text = pc.utf8_rtrim(trimmed, characters="fFdD")  # the regex allowed one suffix, after a digit or '.'
    values = pc.cast(pc.if_else(ok, text, "0"), pa.float64())
    return values, pc.and_(pc.is_valid(s), pc.invert(ok))


def _as_kind(v: Value, kind: Kind) -> tuple[Datum, Datum | None]:
    """``v`` (numeric or string) converted up to a numeric ``kind``: values and failed conversions."""
    if v.kind is Kind.STRING:
        return _parse_double(v.data) if kind is Kind.DOUBLE else _parse_integral(v.data, kind)
    target = pa.float64() if kind is Kind.DOUBLE else pa.int64()
    return pc.cast(v.data, target), None


def _sign(left: Datum, right: Datum, kind: Kind) -> Datum:
    """Java ``compareTo`` of two same-kind values, as -1/0/1 (NaN is above everything, equal to NaN)."""
    if kind is Kind.STRING:
        # Only equality reaches here (ordered strings go through doubles): 0 when equal, else 1.
        return pc.cast(pc.not_equal(left, right), pa.int8())
    sign = pc.subtract(pc.cast(pc.greater(left, right), pa.int8()), pc.cast(pc.less(left, right), pa.int8()))
    if kind is Kind.DOUBLE:
        ln, rn = pc.is_nan(left), pc.is_nan(right)
        nan_sign = pc.subtract(pc.cast(ln, pa.int8()), pc.cast(rn, pa.int8()))
        sign = pc.if_else(pc.or_(ln, rn), nan_sign, sign)
    return sign


def _compare(left: Value, right: Value, ordered: bool) -> tuple[Datum, Datum | None]:
    """RocketMQ's ``__compare`` of two non-null values: a sign (-1/0/1) and where it threw."""
    lk, rk = left.kind, right.kind
    if ordered and lk is Kind.STRING and rk is Kind.STRING:
        (lv, lbad), (rv, rbad) = _parse_double(left.data), _parse_double(right.data)
        return _sign(lv, rv, Kind.DOUBLE), pc.or_(lbad, rbad)
    if lk is rk:
        return _sign(left.data, right.data, lk), None
    if lk is Kind.BOOLEAN or rk is Kind.BOOLEAN:
        if lk is Kind.STRING:  # Boolean.valueOf(string): "true" ignoring case
            as_bool = pc.equal(pc.utf8_lower(left.data), "true")
            return _sign(as_bool, right.data, Kind.BOOLEAN), None
        if rk is Kind.STRING:  # Java casts the Boolean to String: ClassCastException
            return pa.scalar(0, pa.int8()), pa.scalar(True)
        return pa.scalar(-1, pa.int8()), None  # Boolean against a number: "not comparable", -1
    kind = lk if lk is not Kind.STRING and (rk is Kind.STRING or _WIDER[lk] >= _WIDER[rk]) else rk
    lv, lbad = _as_kind(left, kind)
    rv, rbad = _as_kind(right, kind)
    return _sign(lv, rv, kind), _or(lbad, rbad)


_ORDERED = {
    ">": lambda s: pc.greater(s, 0),
    ">=": lambda s: pc.greater_equal(s, 0),
    "<": lambda s: pc.less(s, 0),
    "<=": lambda s: pc.less_equal(s, 0),
}


# ---------------------------------------------------------------------- nodes
class Evaluator:
    """Evaluates syntax trees over one batch; property columns are looked up once each."""

    def __init__(self, lookup: Lookup) -> None:
        self._lookup = lookup
        self._columns: dict[str, pa.Array] = {}

    def matches(self, node: Node) -> Datum:
        """TRUE rows of a condition: neither unknown nor failed."""
        v = self.eval(node)
        hit = pc.fill_null(v.data, False) if v.kind is not Kind.NULL else pa.scalar(False)
        return hit if v.error is None else pc.and_(hit, pc.invert(v.error))

    def eval(self, node: Node) -> Value:
        if isinstance(node, Literal):
            return _literal(node)
        if isinstance(node, Property):
            if node.name not in self._columns:
                self._columns[node.name] = self._lookup(node.name)
            return Value(Kind.STRING, self._columns[node.name])
        if isinstance(node, Negate):
            return self._negate(node)
        if isinstance(node, Not):
            v = self._boolean(node.operand)
            return Value(Kind.BOOLEAN, pc.invert(v.data), v.error)
        if isinstance(node, BoolCast):
            v = self.eval(node.operand)
            return Value(Kind.BOOLEAN, pc.if_else(pc.is_valid(v.data), False, _NULL_BOOL))
        if isinstance(node, Logic):
            return self._logic(node)
        if isinstance(node, Compare):
            return self._equal(node) if node.op == "=" else self._ordered(node)
        if isinstance(node, IsNull):
            v = self.eval(node.operand)
            return Value(Kind.BOOLEAN, pc.invert(_valid(v)), v.error)
        if isinstance(node, In):
            v = self.eval(node.operand)
            hit = pc.is_in(v.data, value_set=pa.array(node.values, pa.string()))
            hit = pc.invert(hit) if node.negated else hit
            return Value(Kind.BOOLEAN, pc.if_else(pc.is_valid(v.data), hit, _NULL_BOOL))
        return self._string_match(node)

    def _boolean(self, node: Node) -> Value:
        v = self.eval(node)
        return Value(Kind.BOOLEAN, _NULL_BOOL, v.error) if v.kind is Kind.NULL else v

    def _negate(self, node: Negate) -> Value:
        v = self.eval(node.operand)
        if v.kind in NUMERIC_KINDS:
            return Value(v.kind, pc.negate(v.data), v.error)
        return Value(Kind.NULL, _NULL_BOOL, v.error)  # RocketMQ negates numbers only; else null

    def _logic(self, node: Logic) -> Value:
        left, right = self._boolean(node.left), self._boolean(node.right)
        if node.op == "AND":
            value = pc.and_kleene(left.data, right.data)
            decided = pc.fill_null(pc.invert(left.data), False)  # FALSE on the left: right not evaluated
        else:
            value = pc.or_kleene(left.data, right.data)
            decided = pc.fill_null(left.data, False)  # TRUE on the left: right not evaluated
        right_error = None if right.error is None else pc.and_(right.error, pc.invert(decided))
        return Value(Kind.BOOLEAN, value, _or(left.error, right_error))

    def _equal(self, node: Compare) -> Value:
        left, right = self.eval(node.left), self.eval(node.right)
        error = _or(left.error, right.error)
        lvalid, rvalid = _valid(left), _valid(right)
        if left.kind is Kind.NULL or right.kind is Kind.NULL:
            equal, failed = pa.scalar(False), None
        else:
            sign, failed = _compare(left, right, ordered=False)
            equal = pc.equal(sign, 0)
        # Both missing: TRUE; left missing: unknown; right missing: FALSE (RocketMQ's doCreateEqual).
        value = pc.if_else(
            lvalid,
            pc.if_else(rvalid, equal, False),
            pc.if_else(rvalid, _NULL_BOOL, True),
        )
        both = pc.and_(lvalid, rvalid)
        return Value(Kind.BOOLEAN, value, _or(error, _and_not_null(failed, both)))

    def _ordered(self, node: Compare) -> Value:
        left, right = self.eval(node.left), self.eval(node.right)
        lvalid, rvalid = _valid(left), _valid(right)
        # The right side is evaluated only when the left is not null.
        error = _or(left.error, _and_not_null(right.error, lvalid))
        if left.kind is Kind.NULL or right.kind is Kind.NULL:
            return Value(Kind.BOOLEAN, _NULL_BOOL, error)
        sign, failed = _compare(left, right, ordered=True)
        both = pc.and_(lvalid, rvalid)
        value = pc.if_else(both, _ORDERED[node.op](sign), _NULL_BOOL)
        return Value(Kind.BOOLEAN, value, _or(error, _and_not_null(failed, both)))

    def _string_match(self, node: StringMatch) -> Value:
        if not node.search:
            return Value(Kind.BOOLEAN, pa.scalar(False))  # RocketMQ answers FALSE before evaluating
        v = self.eval(node.operand)
        if v.kind is not Kind.STRING:
            return Value(Kind.BOOLEAN, pa.scalar(False), v.error)
        if node.op == "CONTAINS":
            hit = pc.match_substring(v.data, node.search)
        elif node.op == "STARTSWITH":
            hit = pc.starts_with(v.data, node.search)
        else:
            hit = pc.ends_with(v.data, node.search)
        hit = pc.invert(hit) if node.negated else hit
        return Value(Kind.BOOLEAN, pc.fill_null(hit, False), v.error)


def _literal(node: Literal) -> Value:
    types = {
        Kind.INT: pa.int64(),
        Kind.LONG: pa.int64(),
        Kind.DOUBLE: pa.float64(),
        Kind.STRING: pa.string(),
        Kind.BOOLEAN: pa.bool_(),
    }
    if node.kind is Kind.NULL:
        return Value(Kind.NULL, _NULL_BOOL)
    return Value(node.kind, pa.scalar(node.value, types[node.kind]))


def evaluate(node: Node, lookup: Lookup, num_rows: int) -> pa.BooleanArray:
    """Rows that a condition selects, as a non-null boolean array of ``num_rows``.

    Args:
        node: a parsed condition (:func:`engine.protocol.sql92_parser.parse_sql92`).
        lookup: the string column of a property by name (null where a message lacks it).
        num_rows: the batch's length (used when the result does not depend on any property).
    """
    hit = Evaluator(lookup).matches(node)
    if isinstance(hit, pa.Scalar):
        return pa.array([bool(hit.as_py())] * num_rows, pa.bool_()) if num_rows else pa.array([], pa.bool_())
    if isinstance(hit, pa.ChunkedArray):
        hit = hit.combine_chunks()
    return hit
