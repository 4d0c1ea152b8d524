"""The commit log's high-water marks, and how commits carry them without growing with the topics.

The marks after a commit-log version are the next physical offset, the newest store time and the
next queue offset of every queue. Two forms are kept in commitInfo:

- a *full* mark (``mq.hwm``, :data:`~engine.store.commit_markers.HWM_KEY`): every queue. Written
  when the table is created and carried by maintenance commits (compaction, retention), and by every
  commit of stores written before compact marks existed.
- a *compact* mark (``mq.marks``, :data:`~engine.store.commit_markers.MARKS_KEY`), on every
  sequenced append: the physical offset and store time, the number of queues known (``n``), and
  the next offsets of the queues the commit wrote plus a rolling slice of the other queues (a
  different slice each version, so that at most :data:`COVER_COMMITS` consecutive commits name every
  queue). Its size depends on the batch and on :func:`slice_size` (32 queues up to 8,192 queues in
  use, then a 256th of them), not on the number of topics x queues.

Every value a mark names is absolute (the next offset after that commit), so the newest value seen
for a queue is its value. A reader rebuilds the marks of a version by walking back from it and
keeping the first value it meets for each queue, until it has met ``n`` distinct queues (the set of
queues only grows) or a full mark (:func:`rebuild`). A writer keeps the marks in memory and, after
losing a race, applies the commits it missed one by one (:func:`replay`): constant work per commit
however many queues exist.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

# A compact mark names at least this many queues besides those its commit wrote ...
MIN_SLICE = 32
# ... and enough that this many consecutive commits name every queue (the walk back after a restart).
COVER_COMMITS = 256


@dataclass
class HighWaterMarks:
    """Next offsets after a given commit-log version (every queue's, in padded per-topic lists)."""

    physical: int = 0
    store_ts_ms: int = 0
    queues: dict[str, list[int]] = field(default_factory=dict)
    _order: list[tuple[str, int]] | None = field(default=None, repr=False, compare=False)

    def to_json(self) -> str:
        """The full mark (every queue)."""
        return json.dumps(
            {"p": self.physical, "t": self.store_ts_ms, "q": self.queues},
            separators=(",", ":"),
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> HighWaterMarks:
        """Parse a full mark."""
        data = json.loads(text)
        return cls(
            int(data.get("p", 0)), int(data.get("t", 0)), {k: list(v) for k, v in data.get("q", {}).items()}
        )

    def copy(self) -> HighWaterMarks:
        return HighWaterMarks(self.physical, self.store_ts_ms, {k: list(v) for k, v in self.queues.items()})

    def next_queue_offset(self, topic: str, queue_id: int) -> int:
        offsets = self.queues.get(topic)
        return offsets[queue_id] if offsets is not None and queue_id < len(offsets) else 0

    @property
    def queue_count(self) -> int:
        """How many queues the marks know (padded lists count every slot)."""
        return len(self._sorted_queues())

    def _sorted_queues(self) -> list[tuple[str, int]]:
        if self._order is None:
            self._order = sorted((t, q) for t, offsets in self.queues.items() for q in range(len(offsets)))
        return self._order

    def apply(self, delta: MarksDelta) -> None:
        """Move these marks on by one commit's :class:`MarksDelta` (in place)."""
        self.physical = max(self.physical, delta.physical)
        self.store_ts_ms = max(self.store_ts_ms, delta.store_ts_ms)
        for topic, changed in delta.queues.items():
            offsets = self.queues.setdefault(topic, [])
            for qid, value in changed.items():
                if qid >= len(offsets):
                    offsets.extend([0] * (qid + 1 - len(offsets)))
                    self._order = None
                offsets[qid] = value

    def compact_json(self, delta: MarksDelta, version: int) -> str:
        """The compact mark of the commit that moves these marks on by ``delta`` at ``version``:
        the queues it writes plus the rolling slice of the others due at that version."""
        order = self._sorted_queues()
        grown = sum(
            max(0, max(changed) + 1 - len(self.queues.get(topic, ())))
            for topic, changed in delta.queues.items()
            if changed
        )
        named: dict[str, dict[int, int]] = {}
        if order:
            size = min(len(order), slice_size(len(order)))
            start = (version * size) % len(order)
            for i in range(start, start + size):
                topic, qid = order[i % len(order)]
                named.setdefault(topic, {})[qid] = self.queues[topic][qid]
        for topic, changed in delta.queues.items():
            named.setdefault(topic, {}).update(changed)
        return json.dumps(
            {
                "p": delta.physical,
                "t": delta.store_ts_ms,
                "n": len(order) + grown,
                "q": {t: {str(q): v for q, v in qs.items()} for t, qs in named.items()},
            },
            separators=(",", ":"),
        )


@dataclass(frozen=True)
class MarksDelta:
    """What one commit changes in the marks: the new physical offset and store time, and the new
    next offset of each queue it writes (``{topic: {queue_id: next}}``)."""

    physical: int
    store_ts_ms: int
    queues: Mapping[str, Mapping[int, int]]

    @classmethod
    def from_compact_json(cls, text: str) -> tuple[MarksDelta, int]:
        """Parse a compact mark: the values it names, and the number of queues known after it."""
        data = json.loads(text)
        queues = {t: {int(q): int(v) for q, v in qs.items()} for t, qs in data.get("q", {}).items()}
        return cls(int(data.get("p", 0)), int(data.get("t", 0)), queues), int(data.get("n", 0))


def slice_size(queue_count: int) -> int:
    """How many other queues a compact mark names, for ``queue_count`` queues in the store."""
    return max(MIN_SLICE, math.ceil(queue_count / COVER_COMMITS))


def replay(hwm: HighWaterMarks, infos: Iterable[Mapping[str, Any]], full_key: str, compact_key: str) -> None:
    """Move ``hwm`` on over the commitInfos of the versions after it, oldest first (in place).

    A full mark replaces the marks, a compact mark is applied, a commit with neither (a compaction
    of rows already counted) changes nothing.
    """
    for info in infos:
        if compact_key in info:
            hwm.apply(MarksDelta.from_compact_json(str(info[compact_key]))[0])
        elif full_key in info:
            full = HighWaterMarks.from_json(str(info[full_key]))
            hwm.physical, hwm.store_ts_ms, hwm.queues, hwm._order = (
                full.physical,
                full.store_ts_ms,
                full.queues,
                None,
            )


def covering(
    infos_newest_first: Iterable[Mapping[str, Any]], full_key: str, compact_key: str
) -> list[Mapping[str, Any]]:
    """The newest commitInfos that decide the marks, oldest first: walked back from the newest
    until they name every queue known (or hold a full mark). Replaying them onto the marks of any
    older version gives what replaying every commit since would (each value is absolute, and the
    newest one of a queue wins); walking is lazy, so older commits are never looked at.
    """
    rebuild = Rebuild(full_key, compact_key)
    needed: list[Mapping[str, Any]] = []
    for info in infos_newest_first:
        needed.append(info)
        if rebuild.add(info):
            break
    needed.reverse()
    return needed


class Rebuild:
    """Rebuilds the marks of one version from the commits walked back from it (newest first):
    feed each commitInfo to :meth:`add` until it returns True, then take :meth:`result`."""

    def __init__(self, full_key: str, compact_key: str) -> None:
        self._full_key, self._compact_key = full_key, compact_key
        self._physical: int | None = None
        self._store_ts = 0
        self._wanted = -1
        self._seen: dict[str, dict[int, int]] = {}
        self._count = 0
        self._full: HighWaterMarks | None = None

    def add(self, info: Mapping[str, Any]) -> bool:
        """Take one older commit's commitInfo; True once the marks are complete."""
        if self._compact_key in info:
            delta, known = MarksDelta.from_compact_json(str(info[self._compact_key]))
            if self._physical is None:
                self._physical, self._store_ts, self._wanted = delta.physical, delta.store_ts_ms, known
            for topic, values in delta.queues.items():
                seen = self._seen.setdefault(topic, {})
                for qid, value in values.items():
                    if qid not in seen:
                        seen[qid] = value
                        self._count += 1
            return self._count >= self._wanted
        if self._full_key in info:
            self._full = HighWaterMarks.from_json(str(info[self._full_key]))
            return True
        return False

    def result(self) -> HighWaterMarks | None:
        """The marks, or None when the commits fed did not complete them."""
        base = self._full
        if base is None:
            if self._physical is None or self._count < self._wanted:
                return None
            base = HighWaterMarks()
        if self._physical is not None:
            base.physical, base.store_ts_ms = self._physical, self._store_ts
        for topic, values in self._seen.items():
            offsets = base.queues.setdefault(topic, [])
            for qid, value in values.items():
                if qid >= len(offsets):
                    offsets.extend([0] * (qid + 1 - len(offsets)))
                offsets[qid] = value
        base._order = None
        return base
