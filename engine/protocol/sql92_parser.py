"""Parse a SQL92 message selector into a syntax tree, as RocketMQ's ``SelectorParser`` does.

The grammar and the checks made while parsing are RocketMQ's (``filter/parser/SelectorParser.jj``
and the ``create*`` factories of its ``ComparisonExpression``), so an expression accepted here is
accepted by a RocketMQ broker and means the same:

- literals: ``'strings'`` (``''`` is a quote), decimal numbers (``0`` or no leading zero, optional
  ``L``; a Java Integer when within 32 bits, else a Long), floating numbers (``1.5``, ``.5``, ``5.``,
  ``5E3``; a Double, and never 0 or infinite: RocketMQ refuses a literal below ``Double.MIN_VALUE``),
  ``TRUE``, ``FALSE``, ``NULL``; keywords are case-insensitive;
- identifiers ``[A-Za-z_$][A-Za-z0-9_$]*`` name message properties (case-sensitive);
- precedence, loosest first: ``OR``; ``AND``; ``=`` ``<>`` ``IS [NOT] NULL``; ``>`` ``>=`` ``<``
  ``<=`` ``[NOT] BETWEEN x AND y`` ``[NOT] IN ('a', …)`` ``[NOT] CONTAINS|STARTSWITH|ENDSWITH 's'``;
  unary ``+`` ``-`` ``NOT``; literals, identifiers and parentheses. ``NOT`` binds tighter than ``=``:
  ``NOT a = 1`` is ``(NOT a) = 1``, as in RocketMQ (write ``NOT (a = 1)``);
- ``--`` comments to the end of a line and ``/* … */`` comments.

One deliberate difference: RocketMQ's parser stops at the end of the first complete expression and
ignores what follows (``a = 1 )`` is accepted there); here any trailing input is an error.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from engine.errors import InvalidSelectorError
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
    is_boolean,
)

KEYWORDS = frozenset(
    {"NOT", "AND", "OR", "BETWEEN", "IN", "TRUE", "FALSE", "NULL", "IS", "CONTAINS", "STARTSWITH", "ENDSWITH"}
)
_NEGATABLE = ("CONTAINS", "STARTSWITH", "ENDSWITH", "BETWEEN", "IN")  # NOT before these is theirs
_INT_MAX = 2**31 - 1
_LONG_MAX = 2**63 - 1
_EXP = r"[eE][+-]?[0-9]+"
# Every token kind, tried at each position; the longest match wins, ties go to the earlier kind.
_TOKEN_KINDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("SKIP", re.compile(r"[ \t\n\r\f]+")),
    ("SKIP", re.compile(r"--[^\n\r]*(?:\r\n|\n|\r)")),  # RocketMQ's line comment needs its newline
    ("SKIP", re.compile(r"/\*[^*]*\*+(?:[^*/][^*]*\*+)*/")),
    ("DECIMAL", re.compile(r"0|[1-9][0-9]*[lL]?")),
    ("FLOAT", re.compile(rf"[0-9]+\.[0-9]*(?:{_EXP})?|\.[0-9]+(?:{_EXP})?|[0-9]+{_EXP}")),
    ("STRING", re.compile(r"'(?:''|[^'])*'")),
    ("ID", re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*")),
    ("OP", re.compile(r"<>|<=|>=|=|<|>|\(|\)|,|\+|-")),
)


@dataclass(frozen=True)
class Token:
    kind: str  # DECIMAL, FLOAT, STRING, ID, OP, a keyword, or EOF
    text: str
    position: int


def tokenize(expression: str) -> list[Token]:
    """Split an expression into tokens (comments and white space dropped), ending with EOF.

    Raises:
        InvalidSelectorError: a character no token starts with (an unclosed quote, ``!``, ``"``, …).
    """
    tokens: list[Token] = []
    pos = 0
    while pos < len(expression):
        best: tuple[str, int] | None = None
        for kind, pattern in _TOKEN_KINDS:
            m = pattern.match(expression, pos)
            if m and m.end() > pos and (best is None or m.end() > best[1]):
                best = (kind, m.end())
        if best is None:
            raise InvalidSelectorError(
                f"SQL92 selector {expression!r}: unexpected character {expression[pos]!r} at {pos}",
                expression=expression,
                position=pos,
            )
        kind, end = best
        text = expression[pos:end]
        if kind == "ID" and text.upper() in KEYWORDS:
            kind = text.upper()
        if kind != "SKIP":
            tokens.append(Token(kind, text, pos))
        pos = end
    tokens.append(Token("EOF", "", len(expression)))
    return tokens


class _Parser:
    """Recursive descent over RocketMQ's productions (orExpression … primaryExpr)."""

    def __init__(self, expression: str) -> None:
        self.expression = expression
        self.tokens = tokenize(expression)
        self.i = 0

    # ------------------------------------------------------------------ helpers
    def error(self, what: str, token: Token | None = None) -> InvalidSelectorError:
        position = token.position if token is not None else None
        where = f" at {position}" if position is not None else ""
        return InvalidSelectorError(
            f"SQL92 selector {self.expression!r}: {what}{where}",
            expression=self.expression,
            position=position,
        )

    def peek(self, ahead: int = 0) -> Token:
        return self.tokens[min(self.i + ahead, len(self.tokens) - 1)]

    def at(self, *kinds: str, ahead: int = 0) -> bool:
        t = self.peek(ahead)
        return t.kind in kinds or (t.kind == "OP" and t.text in kinds)

    def take(self, *kinds: str) -> Token:
        t = self.peek()
        if not self.at(*kinds):
            found = "the end" if t.kind == "EOF" else repr(t.text)
            raise self.error(f"expected {' or '.join(kinds)}, found {found}", t)
        self.i += 1
        return t

    def as_boolean(self, node: Node, token: Token) -> Node:
        if is_boolean(node):
            return node
        if isinstance(node, Property):
            return BoolCast(node)
        raise self.error(f"{_show(node)} is not a condition (it will not result in a boolean value)", token)

    # ------------------------------------------------------------------ productions
    def parse(self) -> Node:
        start = self.peek()
        node = self.as_boolean(self.or_expression(), start)
        if not self.at("EOF"):
            raise self.error(f"unexpected {self.peek().text!r} after a complete expression", self.peek())
        return node

    def or_expression(self) -> Node:
        start = self.peek()
        left = self.and_expression()
        while self.at("OR"):
            op = self.take("OR")
            right = self.and_expression()
            left = Logic("OR", self.as_boolean(left, start), self.as_boolean(right, op))
        return left

    def and_expression(self) -> Node:
        start = self.peek()
        left = self.equality_expression()
        while self.at("AND"):
            op = self.take("AND")
            right = self.equality_expression()
            left = Logic("AND", self.as_boolean(left, start), self.as_boolean(right, op))
        return left

    def equality_expression(self) -> Node:
        left = self.comparison_expression()
        while True:
            t = self.peek()
            if self.at("=", "<>"):
                self.i += 1
                right = self.comparison_expression()
                self.check_equal_operands(left, right, t)
                equal = Compare("=", left, right)
                left = equal if t.text == "=" else Not(equal)
            elif self.at("IS") and self.at("NULL", ahead=1):
                self.i += 2
                left = IsNull(left)
            elif self.at("IS"):
                self.i += 1
                self.take("NOT")
                self.take("NULL")
                left = Not(IsNull(left))
            else:
                return left

    def comparison_expression(self) -> Node:
        left = self.unary_expression()
        while True:
            t = self.peek()
            negated = self.at("NOT") and self.at(
                "CONTAINS", "STARTSWITH", "ENDSWITH", "BETWEEN", "IN", ahead=1
            )
            if negated:
                self.i += 1
                t = self.peek()
            if self.at(">", ">=", "<", "<=") and not negated:
                self.i += 1
                right = self.unary_expression()
                left = self.ordered(t.text, left, right, t)
            elif self.at("CONTAINS", "STARTSWITH", "ENDSWITH"):
                self.i += 1
                left = StringMatch(t.kind, left, self.string_literal(), negated)
            elif self.at("BETWEEN"):
                self.i += 1
                low = self.unary_expression()
                self.take("AND")
                high = self.unary_expression()
                if negated:
                    left = Logic("OR", self.ordered("<", left, low, t), self.ordered(">", left, high, t))
                else:
                    self.check_between_bounds(low, high, t)
                    left = Logic("AND", self.ordered(">=", left, low, t), self.ordered("<=", left, high, t))
            elif self.at("IN"):
                self.i += 1
                if not isinstance(left, Property):
                    raise self.error(f"IN needs a property on its left, got {_show(left)}", t)
                self.take("(")
                values = [self.string_literal()]
                while self.at(","):
                    self.i += 1
                    values.append(self.string_literal())
                self.take(")")
                left = In(left, tuple(values), negated)
            else:
                return left

    def unary_expression(self) -> Node:
        t = self.peek()
        if self.at("+"):
            self.i += 1
            return self.unary_expression()
        if self.at("-"):
            self.i += 1
            return Negate(self.unary_expression())
        if self.at("NOT"):
            self.i += 1
            operand_token = self.peek()
            return Not(self.as_boolean(self.unary_expression(), operand_token))
        return self.primary_expression(t)

    def primary_expression(self, t: Token) -> Node:
        if self.at("("):
            self.i += 1
            node = self.or_expression()
            self.take(")")
            return node
        if self.at("ID"):
            self.i += 1
            return Property(t.text)
        if self.at("STRING"):
            return Literal(self.string_literal(), Kind.STRING)
        if self.at("DECIMAL"):
            self.i += 1
            return self.decimal(t)
        if self.at("FLOAT"):
            self.i += 1
            return self.floating(t)
        if self.at("TRUE", "FALSE"):
            self.i += 1
            return Literal(t.kind == "TRUE", Kind.BOOLEAN)
        if self.at("NULL"):
            self.i += 1
            return Literal(None, Kind.NULL)
        found = "the end" if t.kind == "EOF" else repr(t.text)
        raise self.error(f"expected a literal, a property or '(', found {found}", t)

    def string_literal(self) -> str:
        t = self.take("STRING")
        return t.text[1:-1].replace("''", "'")

    # ------------------------------------------------------------------ RocketMQ's create* checks
    def decimal(self, t: Token) -> Literal:
        value = int(t.text.rstrip("lL"))
        if value > _LONG_MAX:
            raise self.error(f"{t.text} is out of the long range", t)
        return Literal(value, Kind.INT if value <= _INT_MAX else Kind.LONG)

    def floating(self, t: Token) -> Literal:
        value = float(t.text)
        if value == float("inf"):
            raise self.error(f"{t.text} is greater than Double.MAX_VALUE", t)
        if value == 0.0:
            raise self.error(f"{t.text} is less than Double.MIN_VALUE (RocketMQ refuses it)", t)
        return Literal(value, Kind.DOUBLE)

    def ordered(self, op: str, left: Node, right: Node, t: Token) -> Compare:
        for operand in (left, right):
            if (isinstance(operand, Literal) and operand.kind not in NUMERIC_KINDS) or is_boolean(operand):
                raise self.error(f"{_show(operand)} cannot be compared with {op!r} (only numbers can)", t)
        return Compare(op, left, right)

    def check_equal_operands(self, left: Node, right: Node, t: Token) -> None:
        for operand in (left, right):
            if isinstance(operand, Literal) and operand.kind is Kind.NULL:
                raise self.error("NULL cannot be compared with '=' or '<>'; use IS [NOT] NULL", t)
        if (
            isinstance(left, Literal)
            and isinstance(right, Literal)
            and left.kind is Kind.BOOLEAN
            and right.kind is not Kind.BOOLEAN
        ):
            raise self.error(f"{_show(left)} cannot be compared with {_show(right)}", t)

    def check_between_bounds(self, low: Node, high: Node, t: Token) -> None:
        if not (isinstance(low, Literal) and isinstance(high, Literal)):
            return
        if low.kind is Kind.NULL or high.kind is Kind.NULL:
            raise self.error("BETWEEN bounds cannot be NULL", t)
        if (
            low.kind in NUMERIC_KINDS
            and high.kind in NUMERIC_KINDS
            and isinstance(low.value, int | float)
            and isinstance(high.value, int | float)
            and high.value < low.value
        ):
            raise self.error(
                f"BETWEEN {low.value} AND {high.value}: the low bound must not exceed the high", t
            )


def _show(node: Node) -> str:
    if isinstance(node, Literal):
        if node.kind is Kind.STRING:
            return "'" + str(node.value).replace("'", "''") + "'"
        if node.kind is Kind.NULL:
            return "NULL"
        if node.kind is Kind.BOOLEAN:
            return "TRUE" if node.value else "FALSE"
        return repr(node.value)
    if isinstance(node, Property):
        return node.name
    return "a condition" if is_boolean(node) else "an expression"


def parse_sql92(expression: str) -> Node:
    """Parse a SQL92 selector into its syntax tree (pure; no I/O).

    Args:
        expression: the selector, e.g. ``"region = 'eu' AND amount > 100"``.

    Returns:
        The root node; it is a condition (a boolean-valued node).

    Raises:
        InvalidSelectorError: the expression is not a string, is empty, does not parse, or breaks one
            of RocketMQ's type rules (``a > 'x'``, ``a = NULL``, ``x IN`` on a non-property,
            ``BETWEEN 5 AND 1``, a number where a condition is needed, …).
    """
    if not isinstance(expression, str):
        raise InvalidSelectorError(
            f"a SQL92 selector must be a string, got {type(expression).__name__}", expression=expression
        )
    if not expression.strip():
        raise InvalidSelectorError("a SQL92 selector cannot be empty", expression=expression, position=0)
    return _Parser(expression).parse()
