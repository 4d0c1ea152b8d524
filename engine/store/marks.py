"""Markers kept in Delta commitInfo: the latest value of a key as of a table version."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from deltalake import DeltaTable

from engine.errors import StoreError
from engine.store.log import read_version

CQ_KEY = "mq.cq"


# How far back to look for a marker before giving up (compaction and progress commits lack them).
MAX_WALK_BACK = 4096


def latest_commit_value(dt: DeltaTable, key: str) -> str | None:
    """Value of ``key`` in the newest commitInfo at or before ``dt``'s version that has it.

    Reads each commit file by its exact version: delta-rs ``history()`` on a handle that is behind
    the log lists the newest commits under older version numbers, which would let a reader see marks
    ahead of the files it has. Returns None when no commit left in the log carries the key.
    """
    found = find_commit_value(dt, key)
    return None if found is None else found[1]


def find_commit_value(
    dt: DeltaTable,
    key: str,
    accept: Callable[[str], bool] | None = None,
    walk_back: int | None = MAX_WALK_BACK,
) -> tuple[int, str] | None:
    """``(version, value)`` of the newest commit at or before ``dt``'s version whose commitInfo has
    ``key`` (with a value ``accept`` takes, when given), read by exact version as
    :func:`latest_commit_value` does.

    ``walk_back`` bounds the commits examined (None: back to the first one left in the log). Returns
    None when no commit left in the log matches.
    """
    version = int(dt.version())
    uri = dt.table_uri
    options = getattr(dt, "_storage_options", None)
    stop = -1 if walk_back is None else max(version - walk_back, -1)
    for v in range(version, stop, -1):
        try:
            info = read_version(uri, v, options).commit_info
        except StoreError:
            return None  # older commits were cleaned up after a checkpoint
        if key in info and (accept is None or accept(str(info[key]))):
            return v, str(info[key])
    return None


@dataclass
class QueueMarks:
    """Consume-queue bounds per queue: next offset to dispatch and minimum retained offset."""

    next: dict[str, list[int]] = field(default_factory=dict)
    min: dict[str, list[int]] = field(default_factory=dict)
    log_version: int = -1

    def max_offset(self, topic: str, queue_id: int) -> int:
        offsets = self.next.get(topic)
        return offsets[queue_id] if offsets is not None and queue_id < len(offsets) else 0

    def min_offset(self, topic: str, queue_id: int) -> int:
        offsets = self.min.get(topic)
        return offsets[queue_id] if offsets is not None and queue_id < len(offsets) else 0

    def set_next(self, topic: str, queue_id: int, value: int) -> None:
        offsets = self.next.setdefault(topic, [])
        while len(offsets) <= queue_id:
            offsets.append(0)
        offsets[queue_id] = value

    def set_min(self, topic: str, queue_id: int, value: int) -> None:
        offsets = self.min.setdefault(topic, [])
        while len(offsets) <= queue_id:
            offsets.append(0)
        offsets[queue_id] = value

    def to_json(self) -> str:
        data: dict[str, Any] = {"q": self.next, "m": self.min, "v": self.log_version}
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | None) -> QueueMarks:
        if not text:
            return cls()
        data = json.loads(text)
        return cls(
            {k: list(v) for k, v in data.get("q", {}).items()},
            {k: list(v) for k, v in data.get("m", {}).items()},
            int(data.get("v", -1)),
        )

    def copy(self) -> QueueMarks:
        return QueueMarks.from_json(self.to_json())


def queue_marks(dt: DeltaTable) -> QueueMarks:
    """Consume-queue marks as of ``dt``'s version."""
    return QueueMarks.from_json(latest_commit_value(dt, CQ_KEY))
