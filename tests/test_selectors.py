"""MessageSelector: RocketMQ's SQL92 grammar and semantics, evaluated vectorised over Arrow batches.

The expected matches follow RocketMQ's broker (``filter/expression/*``): properties are strings, a
missing property is NULL (unknown is false), a string compared with a number is converted as Java's
``Integer.valueOf`` / ``Long.valueOf`` / ``Double.valueOf`` would, and an evaluation that throws (a
failed conversion) makes the message not match, whatever the rest of the expression says.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from engine import ExpressionType, InvalidArgumentError, InvalidSelectorError, MessageSelector
from engine.protocol import java_string_hashcode, parse_sql92
from engine.protocol.pull import batch_full, batch_stop
from engine.protocol.sql92_ast import Compare, Kind, Literal, Logic, Not, Property
from engine.protocol.sql92_parser import tokenize
from engine.store.schemas import COMMIT_LOG_SCHEMA

PROPS = pa.map_(pa.string(), pa.string())
# message index -> (tag, properties)
MESSAGES: list[tuple[str | None, dict[str, str] | None]] = [
    ("A", {"a": "3", "b": "4", "region": "eu", "s": "axb"}),  # 0
    ("B", {"a": "10", "b": "4", "region": "us", "s": "hello"}),  # 1
    (None, {"a": "abc", "region": "eu"}),  # 2: a is not a number
    ("A", None),  # 3: no properties at all
    ("C", {"a": "3.5", "b": "true", "region": "apac", "s": "it's"}),  # 4: a is not an integer
    ("A", {"a": "3000000000", "b": "FALSE"}),  # 5: a is past 32 bits
]
ALL = set(range(len(MESSAGES)))


def rows(messages: list[tuple[str | None, dict[str, str] | None]] = MESSAGES) -> pa.Table:
    props = [None if p is None else list(p.items()) for _, p in messages]
    return pa.table(
        {"tags": pa.array([t for t, _ in messages], pa.string()), "properties": pa.array(props, PROPS)}
    )


def selected(expression: str, table: pa.Table | None = None) -> set[int]:
    mask = MessageSelector.by_sql(expression).matches(rows() if table is None else table)
    assert mask.type == pa.bool_() and mask.null_count == 0
    return {i for i, hit in enumerate(mask.to_pylist()) if hit}


GRAMMAR = [
    # numbers: a 32-bit literal converts the property with Integer.valueOf, a wider one with Long
    ("a = 3", {0}),
    ("a = 3.0", {0}),
    ("a > 3", {1}),
    ("a > 3.0", {1, 4, 5}),
    ("a > 2147483648", {5}),
    ("a = 10L", {1}),
    ("a > .5E1", {1, 5}),
    ("a > -1", {0, 1}),
    ("3 = a", {0}),
    ("a >= 3 AND a <= 10", {0, 1}),
    ("a BETWEEN 3 AND 10", {0, 1}),
    ("a NOT BETWEEN 4 AND 10", {0}),
    # strings, IN, NULL
    ("region = 'eu'", {0, 2}),
    ("region <> 'eu'", {1, 4}),
    ("NOT (region = 'eu')", {1, 4}),
    ("s = 'it''s'", {4}),
    ("a IN ('3', '10')", {0, 1}),
    ("a NOT IN ('3')", {1, 2, 4, 5}),
    ("a IS NULL", {3}),
    ("a IS NOT NULL", {0, 1, 2, 4, 5}),
    ("a = b", {3}),  # both missing: TRUE, as RocketMQ's equality says
    ("a > b", {1}),  # two properties compare as doubles
    # RocketMQ 5 string functions: false when missing or for an empty pattern
    ("s CONTAINS 'x'", {0}),
    ("s NOT CONTAINS 'x'", {1, 4}),
    ("s STARTSWITH 'he'", {1}),
    ("s NOT STARTSWITH 'he'", {0, 4}),
    ("s ENDSWITH 's'", {4}),
    ("s NOT ENDSWITH 's'", {0, 1}),
    ("s CONTAINS ''", set()),
    ("'axb' CONTAINS 'x'", ALL),
    # TAGS is the message's tag
    ("TAGS = 'A'", {0, 3, 5}),
    ("TAGS IS NULL", {2}),
    ("TAGS IN ('B', 'C')", {1, 4}),
    # booleans: a property equals TRUE when it is "true" ignoring case
    ("b = TRUE", {4}),
    ("b = FALSE", {0, 1, 5}),
    ("TRUE", ALL),
    ("FALSE", set()),
    ("NULL", set()),
    ("1 = 1", ALL),
    ("a", set()),  # a bare property is a string, never TRUE
    ("NOT a", {0, 1, 2, 4, 5}),
    ("NOT a = 1", set()),  # NOT binds tighter: (NOT a) = 1, a Boolean against a number
    ("a > 3 = TRUE", {1}),
    # three-valued logic and RocketMQ's left-to-right evaluation that stops at a failed conversion
    ("a = 3 AND b = 4", {0}),
    ("(a = 3 OR a = 10) AND region = 'us'", {1}),
    ("region = 'eu' OR a > 5", {0, 1, 2}),
    ("a > 5 OR region = 'eu'", {0, 1}),
    ("NOT (a > 3)", {0}),
    ("NOT (a = 3)", {1}),
    ("NOT (3 = a)", {1, 3}),  # a missing on the right of '=' is FALSE, not unknown
    ("a IS NULL OR a = 'hello'", {3}),
    # syntax: case-insensitive keywords, comments
    ("region = 'eu' and a is not null", {0, 2}),
    ("/* c */ region = 'eu' -- trailing\n", {0, 2}),
]


@pytest.mark.parametrize(("expression", "expected"), GRAMMAR, ids=[e for e, _ in GRAMMAR])
def test_sql92_selects_what_rocketmq_selects(expression: str, expected: set[int]) -> None:
    assert selected(expression) == expected


BAD = [
    ("", 0),
    ("   ", 0),
    ("a >", 3),
    ("a = NULL", 2),
    ("a > 'x'", 2),
    ("a > TRUE", 2),
    ("5", 0),
    ("'abc'", 0),
    ("-a", 0),
    ("NOT 5", 4),
    ("a = 1 )", 6),
    ("a = 007", 5),
    ("a BETWEEN 10 AND 1", 2),
    ("a BETWEEN 1", 11),
    ("3 IN ('x')", 2),
    ("a IN (1, 2)", 6),
    ("a IN ()", 6),
    ("a CONTAINS x", 11),
    ("a CONTAINS 123", 11),
    ("a > 0.0", 4),
    ("a > 1e400", 4),
    ("a > 9223372036854775808", 4),
    ("a == 1", 3),
    ("a != 1", 2),
    ("a = 'unterminated", 4),
    ("a = 1 AND", 9),
    ("a > b > c", 6),
    ("TRUE = 1", 5),
    ("a = 1 -- a comment needs its newline", 6),
    ("(a = 1", 6),
    ("a IS NOT 5", 9),
]


@pytest.mark.parametrize(("expression", "position"), BAD, ids=[e or "<empty>" for e, _ in BAD])
def test_bad_sql92_is_a_typed_error_naming_the_position(expression: str, position: int) -> None:
    with pytest.raises(InvalidSelectorError) as caught:
        MessageSelector.by_sql(expression)
    assert caught.value.expression == expression
    assert caught.value.position == position
    assert isinstance(caught.value, InvalidArgumentError)


def test_a_non_string_sql_expression_is_a_typed_error() -> None:
    with pytest.raises(InvalidSelectorError):
        MessageSelector.by_sql(5)  # type: ignore[arg-type]


def test_longest_literals_and_keywords_parse_to_their_java_types() -> None:
    assert parse_sql92("a = 2147483647") == Compare("=", Property("a"), Literal(2147483647, Kind.INT))
    assert parse_sql92("a = 2147483648") == Compare("=", Property("a"), Literal(2147483648, Kind.LONG))
    assert parse_sql92("a = 9223372036854775807L").right == Literal(2**63 - 1, Kind.LONG)  # type: ignore[union-attr]
    assert parse_sql92("a <> 1.5") == Not(Compare("=", Property("a"), Literal(1.5, Kind.DOUBLE)))
    between = parse_sql92("a between 1 AND 2")
    assert isinstance(between, Logic) and between.op == "AND"
    assert parse_sql92("ANDY = 1") == Compare("=", Property("ANDY"), Literal(1, Kind.INT))


def test_tokens_are_the_longest_match_and_comments_are_dropped() -> None:
    tokens = tokenize("a<>5.5e3 /* x */ AnD b<=1L -- y\n IS NOT")
    assert [(t.kind, t.text) for t in tokens] == [
        ("ID", "a"),
        ("OP", "<>"),
        ("FLOAT", "5.5e3"),
        ("AND", "AnD"),
        ("ID", "b"),
        ("OP", "<="),
        ("DECIMAL", "1L"),
        ("IS", "IS"),
        ("NOT", "NOT"),
        ("EOF", ""),
    ]
    assert [t.position for t in tokens][:3] == [0, 1, 3]


def test_property_values_convert_as_java_does() -> None:
    values = ["5", "+5", "-5", "0005", " 5", "5.0", "5e0", "2147483648", "-2147483648", "x", ""]
    table = rows([(None, {"a": v}) for v in values])
    assert [values[i] for i in sorted(selected("a = 5", table))] == ["5", "+5", "0005"]
    # a double literal converts with Double.valueOf: trimmed, exponents, f/d suffixes
    table = rows([(None, {"a": v}) for v in [" 5 ", "5e0", "5d", "5.0f", "NaN", "Infinity", "0x5"]])
    assert selected("a = 5.0", table) == {0, 1, 2, 3}
    assert selected("a > 1.0E300", table) == {4, 5}  # NaN sorts above everything, as compareTo says
    table = rows([(None, {"a": v}) for v in ["2147483648", "-2147483648", "-2147483649"]])
    assert selected("a < 0", table) == {1}  # past 32 bits fails Integer.valueOf: no match
    assert selected("a < 1L", table) == {1}  # 1L is still a 32-bit Integer literal
    assert selected("a < 2147483648", table) == {1, 2}  # a Long literal: Long.valueOf


def test_selectors_evaluate_batches_of_any_shape() -> None:
    table = rows()
    chunked = pa.concat_tables([table.slice(0, 2), table.slice(2)])
    assert chunked["properties"].num_chunks == 2
    assert selected("region = 'eu'", chunked) == {0, 2}
    empty = table.slice(0, 0)
    assert MessageSelector.by_sql("a > 1").matches(empty).to_pylist() == []
    assert MessageSelector.by_sql("TRUE").matches(empty).to_pylist() == []
    commit_log_rows = COMMIT_LOG_SCHEMA.empty_table()
    assert len(MessageSelector.by_sql("TAGS = 'A' AND a > 1").matches(commit_log_rows)) == 0


def test_selector_values_and_plain_strings() -> None:
    tag = MessageSelector.of("TagA || TagB")
    assert (tag.type, tag.expression, tag.matches_all) == (ExpressionType.TAG, "TagA || TagB", False)
    assert MessageSelector.of(None) == MessageSelector.by_tag("*")
    assert MessageSelector.of(None).matches_all
    sql = MessageSelector.by_sql("a > 1")
    assert MessageSelector.of(sql) is sql
    assert sql == MessageSelector.parse("sql92", "a > 1") and sql != MessageSelector.by_tag("a > 1")
    assert sql.properties == frozenset({"a"}) and not sql.matches_all and sql.tag_filter is None
    assert tag.tag_filter is not None and tag.tag_filter.tags == frozenset({"TagA", "TagB"})
    assert tag.properties == frozenset()
    assert MessageSelector.by_sql("TRUE").matches_all
    assert str(sql) == "SQL92: a > 1" and str(tag) == "TagA || TagB"
    with pytest.raises(InvalidSelectorError):
        MessageSelector.parse("XPATH", "a")
    with pytest.raises(InvalidSelectorError):
        MessageSelector.of(42)  # type: ignore[arg-type]
    with pytest.raises(InvalidSelectorError) as caught:
        MessageSelector.by_tag("TagA ||")
    assert isinstance(caught.value, InvalidArgumentError)


def test_tag_selector_matches_codes_then_confirms_the_tag_string() -> None:
    assert java_string_hashcode("Aa") == java_string_hashcode("BB")  # a known Java collision
    selector = MessageSelector.by_tag("Aa || C")
    codes = pa.array([java_string_hashcode(t) for t in ["Aa", "BB", "C", "D"]], pa.int64())
    assert selector.match_codes(codes).to_pylist() == [True, True, True, False]
    table = rows([("Aa", None), ("BB", None), ("C", None), (None, None)])
    assert selector.matches(table).to_pylist() == [True, False, True, False]
    assert MessageSelector.by_sql("a = 1").match_codes(codes).to_pylist() == [True] * 4  # SQL: no code stage
    assert MessageSelector.by_tag("*").matches(table).to_pylist() == [True] * 4


BATCHES = [
    # matched, sizes, max_count, max_bytes, expected stop
    ([1, 1, 1, 1], [10, 10, 10, 10], 2, 1000, 2),  # the count is full before the third entry
    ([1, 0, 1, 1], [10, 10, 10, 10], 2, 1000, 3),  # filtered entries do not count
    ([1, 1, 1], [100, 100, 100], 32, 250, 2),  # the third would pass 250 bytes
    ([1, 1], [500, 10], 32, 250, 1),  # the first is taken whatever its size
    ([0, 0, 1], [500, 500, 500], 32, 250, 3),  # nothing taken yet: nothing is full
    ([1, 0, 1], [100, 900, 100], 32, 250, 1),  # a filtered entry's size stops the batch too (RocketMQ)
    ([], [], 32, 250, 0),
]


@pytest.mark.parametrize(("matched", "sizes", "count", "nbytes", "stop"), BATCHES)
def test_batch_stop_is_rocketmqs_is_the_batch_full(
    matched: list[int], sizes: list[int], count: int, nbytes: int, stop: int
) -> None:
    assert batch_stop(np.array(matched, bool), np.array(sizes, np.int64), count, nbytes) == stop


@pytest.mark.parametrize(("matched", "sizes", "count", "nbytes", "stop"), BATCHES)
def test_batch_full_entry_by_entry_stops_where_batch_stop_does(
    matched: list[int], sizes: list[int], count: int, nbytes: int, stop: int
) -> None:
    taken = taken_bytes = 0
    at = len(matched)
    for i, (hit, size) in enumerate(zip(matched, sizes, strict=True)):
        if batch_full(taken, taken_bytes, size, count, nbytes):
            at = i
            break
        if hit:
            taken, taken_bytes = taken + 1, taken_bytes + size
    assert at == stop


def test_batch_stop_carries_what_earlier_windows_took() -> None:
    assert batch_stop(np.array([1, 1], bool), np.array([10, 10], np.int64), 3, 1000, count=2) == 1
    assert batch_stop(np.array([1], bool), np.array([10], np.int64), 32, 100, count=1, size=95) == 0


def test_the_benchmarks_selectors_agree_with_their_row_by_row_python_reference() -> None:
    from bench.selector_filters import CASES, evaluation

    results = evaluation(rows=2_000, repeat=1)  # raises when a mask differs from the reference
    assert [r["expression"] for r in results] == [e for e, _ in CASES]
    assert all(0 < r["matched"] < 2_000 for r in results)
