"""Message selectors: RocketMQ's ``MessageSelector.byTag`` / ``bySql``, evaluated over Arrow batches.

A selector filters in two stages, as RocketMQ's broker does:

1. :meth:`MessageSelector.match_codes` on consume-queue entries (their ``tags_code``): a tag selector
   keeps the entries whose tag hash is subscribed; a SQL92 selector keeps every entry (RocketMQ's
   bloom-filter stage is an optimisation with false positives, left out here).
2. :meth:`MessageSelector.matches` on commit-log rows (columns ``tags`` and ``properties``, the
   ``map<string, string>`` of the commit-log schema): a tag selector checks the tag string (hash codes
   collide); a SQL92 selector evaluates the expression, vectorised. In SQL92, ``TAGS`` is the
   message's tag and every other identifier a property.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.errors import InvalidArgumentError, InvalidSelectorError
from engine.protocol.names import PROPERTY_TAGS
from engine.protocol.sql92_ast import Literal, Node, properties_of
from engine.protocol.sql92_eval import evaluate
from engine.protocol.sql92_parser import parse_sql92
from engine.protocol.tags import TagFilter, parse_tag_expression


class ExpressionType(enum.StrEnum):
    """How a selector's expression is read (RocketMQ's ``ExpressionType``)."""

    TAG = "TAG"
    SQL92 = "SQL92"


@dataclass(frozen=True)
class MessageSelector:
    """Which messages of a topic a consumer wants: a tag expression or a SQL92 condition.

    Build one with :meth:`by_tag` or :meth:`by_sql`; everywhere a selector is accepted, a plain string
    is read as a tag expression. Parsing happens once, when the selector is built, so a bad
    expression fails at subscribe time. Two selectors are equal when type and text are.

    Attributes:
        type: TAG or SQL92.
        expression: the text as given.
    """

    type: ExpressionType
    expression: str
    _tags: TagFilter | None = field(default=None, repr=False, compare=False)
    _sql: Node | None = field(default=None, repr=False, compare=False)

    @classmethod
    def by_tag(cls, expression: str | None = "*") -> MessageSelector:
        """A tag selector: ``"*"`` (everything), ``"TagA"`` or ``"TagA || TagB"``.

        Raises:
            InvalidSelectorError: not a string, or an empty alternative (``"TagA ||"``).
        """
        text = "*" if expression is None else expression
        try:
            tags = parse_tag_expression(text)
        except InvalidArgumentError as exc:
            raise InvalidSelectorError(exc.message, expression=expression) from exc
        return cls(ExpressionType.TAG, text, _tags=tags)

    @classmethod
    def by_sql(cls, expression: str) -> MessageSelector:
        """A SQL92 selector over message properties, e.g. ``"region = 'eu' AND amount > 100"``.

        The grammar, types and NULL rules are RocketMQ's (see :mod:`engine.protocol.sql92_parser`
        and :mod:`engine.protocol.sql92_eval`): a message lacking a property, or whose property is not
        a number where a number is compared, does not match.

        Raises:
            InvalidSelectorError: the expression does not parse or breaks a type rule; the error
                carries ``expression`` and ``position``.
        """
        return cls(ExpressionType.SQL92, expression, _sql=parse_sql92(expression))

    @classmethod
    def of(cls, selector: MessageSelector | str | None) -> MessageSelector:
        """``selector`` itself, or a tag selector for a string (``None`` is ``"*"``).

        Raises:
            InvalidSelectorError: a bad tag expression, or neither a selector nor a string.
        """
        if isinstance(selector, MessageSelector):
            return selector
        if selector is None or isinstance(selector, str):
            return cls.by_tag(selector)
        raise InvalidSelectorError(
            f"expected a MessageSelector or a tag expression string, got {type(selector).__name__}",
            expression=selector,
        )

    @classmethod
    def parse(cls, expression_type: str, expression: str) -> MessageSelector:
        """A selector from its type name (``"TAG"`` or ``"SQL92"``, any case) and text.

        Raises:
            InvalidSelectorError: an unknown type or a bad expression.
        """
        kind = str(expression_type).strip().upper()
        if kind == ExpressionType.TAG:
            return cls.by_tag(expression)
        if kind == ExpressionType.SQL92:
            return cls.by_sql(expression)
        raise InvalidSelectorError(
            f"expression type {expression_type!r} is unknown; use TAG or SQL92", expression=expression
        )

    # ------------------------------------------------------------------ reading the selector
    @property
    def matches_all(self) -> bool:
        """Whether every message matches (the tag expression ``"*"``, or the SQL92 ``TRUE``)."""
        if self._tags is not None:
            return self._tags.matches_all
        return isinstance(self._sql, Literal) and self._sql.value is True

    @property
    def tag_filter(self) -> TagFilter | None:
        """The parsed tag expression of a TAG selector (None for SQL92)."""
        return self._tags

    @property
    def properties(self) -> frozenset[str]:
        """The property names a SQL92 selector reads (empty for TAG)."""
        return properties_of(self._sql) if self._sql is not None else frozenset()

    # ------------------------------------------------------------------ filtering
    def match_codes(self, tags_codes: pa.Array | pa.ChunkedArray) -> pa.BooleanArray:
        """First stage, on consume-queue entries: which ``tags_code`` values may match.

        Exact for no selector but a tag one (hash codes may collide: confirm with :meth:`matches`);
        a SQL92 selector keeps every entry.
        """
        n = len(tags_codes)
        if self.matches_all or self._tags is None:
            return pa.array([True] * n, pa.bool_()) if n else pa.array([], pa.bool_())
        codes = pa.array(sorted(self._tags.codes), pa.int64())
        return _flat(pc.is_in(tags_codes, value_set=codes))

    def matches(self, rows: pa.Table) -> pa.BooleanArray:
        """Second stage, on commit-log rows: which messages match, as a non-null boolean array.

        Args:
            rows: commit-log rows with the ``tags`` (string) and, for SQL92, ``properties``
                (``map<string, string>``) columns of :data:`engine.store.schemas.COMMIT_LOG_SCHEMA`.

        Returns:
            One boolean per row, vectorised with ``pyarrow.compute``.
        """
        n = rows.num_rows
        if self.matches_all:
            return pa.array([True] * n, pa.bool_()) if n else pa.array([], pa.bool_())
        if self._tags is not None:
            wanted = pa.array(sorted(self._tags.tags), pa.string())
            return _flat(pc.is_in(rows["tags"], value_set=wanted))
        assert self._sql is not None
        return evaluate(self._sql, _Properties(rows), n)

    def __str__(self) -> str:
        return self.expression if self.type is ExpressionType.TAG else f"SQL92: {self.expression}"


def _flat(mask: pa.Array | pa.ChunkedArray) -> pa.BooleanArray:
    mask = mask.combine_chunks() if isinstance(mask, pa.ChunkedArray) else mask
    return pc.fill_null(mask, False)


class _Properties:
    """Property columns of a batch, looked up in the flattened ``properties`` map.

    ``pyarrow.compute.map_lookup`` costs about 1 µs a row; one flattening of the maps (keys, values,
    and the row each entry belongs to) serves every property the expression reads, and a lookup is
    then one vectorised key comparison and a ``take``.
    """

    def __init__(self, rows: pa.Table) -> None:
        self._rows = rows
        self._flat: tuple[pa.Array, pa.Array, np.ndarray] | None = None

    def _flattened(self) -> tuple[pa.Array, pa.Array, np.ndarray]:
        if self._flat is None:
            column = self._rows["properties"]
            maps = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
            # Arrow flattens lists, not maps: view the map as a list of its (key, value) entries.
            offsets = pa.array(maps.offsets.to_numpy(zero_copy_only=False))
            entries = pa.ListArray.from_arrays(offsets, maps.values, mask=maps.is_null())
            flat = pc.list_flatten(entries)
            parents = pc.list_parent_indices(entries).to_numpy(zero_copy_only=False)
            self._flat = (flat.field(0), flat.field(1), parents)
        return self._flat

    def __call__(self, name: str) -> pa.Array:
        """A property's string column (null where a message lacks it); ``TAGS`` is the tags column."""
        if name == PROPERTY_TAGS:
            column = self._rows["tags"]
            return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        keys, values, parents = self._flattened()
        hits = np.flatnonzero(pc.equal(keys, name).to_numpy(zero_copy_only=False))
        owners = parents[hits]  # ascending: entries are flattened in row order
        first = np.ones(len(owners), dtype=bool)  # the first entry of a name in a map wins
        first[1:] = owners[1:] != owners[:-1]
        index = np.full(self._rows.num_rows, -1, dtype=np.int64)
        index[owners[first]] = hits[first]
        return values.take(pa.array(index, mask=index < 0))
