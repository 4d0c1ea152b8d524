"""Re-puts: new commit-log messages copied from stored rows (schedule deliveries and timer moves,
retries, dead letters). A re-put keeps the stored message's body, tags, keys, uniq key (the id
consumers see) and born time; the caller says where it goes and what else it carries."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.store.commit_log import PendingMessage


def row_properties(row: Mapping[str, Any]) -> dict[str, str]:
    """A commit-log row's properties as a dict (Arrow maps read as lists of pairs)."""
    props = row.get("properties") or {}
    return dict(props) if not isinstance(props, Mapping) else {str(k): str(v) for k, v in props.items()}


def reput(row: Mapping[str, Any], **fields: Any) -> PendingMessage:
    """A copy of the stored message ``row`` with ``fields`` (topic, queue_id, properties, …) set; pure."""
    return PendingMessage(
        body=bytes(row["body"]),
        uniq_key=str(row["uniq_key"]),
        tags=row.get("tags"),
        keys=tuple(row.get("keys") or ()),
        born_ts_ms=int(row["born_ts_ms"]),
        **fields,
    )
