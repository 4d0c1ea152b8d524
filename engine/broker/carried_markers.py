"""The commitInfo markers that maintenance commits (compaction, retention) carry forward, and the
commit that carries them."""

from __future__ import annotations

from collections.abc import Callable

from engine.broker.pull_log import MARKS_KEY as PULL_LOG_MARKS_KEY
from engine.store import schemas
from engine.store.marks import CQ_KEY
from engine.store.rewrite import Commit, Snapshot, commit_planned
from engine.store.sequencer import HWM_KEY
from engine.store.store import Store

# commitInfo keys that describe the table's state as of a commit and must survive maintenance commits.
# A per-commit key (such as the sequencer's batch id) must never be listed here.
CARRIED_MARKERS: dict[str, tuple[str, ...]] = {
    schemas.COMMIT_LOG: (HWM_KEY,),
    schemas.CONSUME_QUEUE: (CQ_KEY,),
    schemas.PULL_LOG: (PULL_LOG_MARKS_KEY,),
}


def commit(store: Store, name: str, plan: Callable[[Snapshot], Commit | None], operation: str) -> int | None:
    """:func:`engine.store.rewrite.commit_planned` carrying table ``name``'s :data:`CARRIED_MARKERS`."""
    return commit_planned(store, name, plan, operation, CARRIED_MARKERS.get(name, ()))
