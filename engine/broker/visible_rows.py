"""Which commit-log rows a consumer will ever see: the filter dispatch and the index share."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from engine.model import UNDISPATCHED_FLAGS
from engine.store.delta import VERSION_COLUMN

_HIDDEN_FLAGS = pa.array(sorted(UNDISPATCHED_FLAGS), pa.int32())


def visible_rows_after(rows: pa.Table, last: int) -> tuple[pa.Table, int]:
    """The commit-log ``rows`` (carrying ``_version``) of versions after ``last`` that consumers can
    see (transaction halves and rolled-back messages are not), and the last version among those
    newer rows (``last`` when there is none: the caller has nothing to cover). Pure."""
    rows = rows.filter(pc.greater(rows[VERSION_COLUMN], last))
    if rows.num_rows == 0:
        return rows, last
    covered = int(pc.max(rows[VERSION_COLUMN]).as_py())
    return rows.filter(pc.invert(pc.is_in(rows["sys_flag"], value_set=_HIDDEN_FLAGS))), covered
