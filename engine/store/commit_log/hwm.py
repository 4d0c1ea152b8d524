"""The commit log's high-water marks as of a version: read from the marks its commits carry (see
:mod:`engine.store.commit_log.marks`), from those saved at a checkpoint, or, when the log lost both,
rebuilt from the rows; and the checkpoint that saves them first."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from engine.errors import CommitTruncatedError, StoreError
from engine.protocol.shards import shard_base
from engine.store import schemas
from engine.store.commit_log import saved_marks
from engine.store.commit_log.marks import HighWaterMarks, Rebuild, replay
from engine.store.commit_markers import HWM_KEY, MARKS_KEY
from engine.store.delta import MAX_WALK_BACK, Snapshot


def read_hwm(snapshot: Snapshot) -> HighWaterMarks:
    """High-water marks as of ``snapshot``'s version.

    Walks back from that version over the commits' marks until they name every queue, or to the
    newest full mark (see :mod:`engine.store.commit_log.marks`); if the log no longer holds enough of them,
    recovers the marks by scanning the table.
    """
    rebuild = Rebuild(HWM_KEY, MARKS_KEY)
    version = snapshot.version()
    for v in range(version, max(version - MAX_WALK_BACK, -1), -1):
        try:
            info = snapshot.commit_info(v)
        except CommitTruncatedError:
            raise
        except StoreError:
            break  # older commits were cleaned up after a checkpoint
        if rebuild.add(info):
            break
    marks = rebuild.result()
    if marks is None:
        marks = _from_saved_marks(snapshot)
    return marks if marks is not None else recover_hwm_by_scan(snapshot)


def marks_after(full: str, infos: Iterable[Mapping[str, Any]]) -> str:
    """The full marks ``full`` (an ``mq.hwm`` value) moved on over the commitInfos of the commits
    after them, oldest first: the marks a commit landing after those carries."""
    hwm = HighWaterMarks.from_json(full)
    replay(hwm, infos, HWM_KEY, MARKS_KEY)
    return hwm.to_json()


def _from_saved_marks(snapshot: Snapshot) -> HighWaterMarks | None:
    """The marks saved at the newest checkpoint (:mod:`engine.store.commit_log.saved_marks`), moved on
    over the commits since; None when there are none or those commits are gone too."""
    version = snapshot.version()
    saved = saved_marks.load(snapshot.uri, snapshot.storage_options, version)
    if saved is None:
        return None
    base, hwm = saved
    try:
        replay(hwm, (snapshot.commit_info(v) for v in range(base + 1, version + 1)), HWM_KEY, MARKS_KEY)
    except CommitTruncatedError:
        raise
    except StoreError:
        return None
    return hwm


def checkpoint_commit_log(snapshot: Snapshot, hwm: HighWaterMarks, *, cleanup: bool = True) -> None:
    """Checkpoint the commit log at ``snapshot``'s version, whose marks are ``hwm``: the marks are
    saved first, since the cleanup may delete the commits that carry them.

    Raises:
        StoreError: the marks or the checkpoint could not be written (no cleanup happened then).
    """
    saved_marks.save(snapshot.uri, snapshot.storage_options, snapshot.version(), hwm)
    snapshot.checkpoint(cleanup=cleanup)


def recover_hwm_by_scan(snapshot: Snapshot) -> HighWaterMarks:
    """Rebuild the marks from the rows themselves (slow; only when the log lost them)."""
    table = snapshot.dataset().to_table(
        columns=["physical_offset", "size", "topic", "queue_id", "queue_offset", "store_ts_ms"]
    )
    hwm = HighWaterMarks()
    if table.num_rows == 0:
        hwm.physical = shard_base(schemas.shard_of_table(snapshot.name) or 0)
        return hwm
    ends = pc.add(table["physical_offset"], pc.cast(table["size"], pa.int64()))
    hwm.physical = int(pc.max(ends).as_py())
    hwm.store_ts_ms = int(pc.max(table["store_ts_ms"]).as_py())
    grouped = table.group_by(["topic", "queue_id"]).aggregate([("queue_offset", "max")])
    for row in grouped.to_pylist():
        offsets = hwm.queues.setdefault(row["topic"], [])
        while len(offsets) <= row["queue_id"]:
            offsets.append(0)
        offsets[row["queue_id"]] = int(row["queue_offset_max"]) + 1
    return hwm
