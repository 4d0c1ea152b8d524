"""Cost of one commit-log append as a function of the table's live data files.

    python bench/commit_cost.py [--files 50 200 800 2000] [--repeat 15] [--profile]

For each file count a fresh store's commit log gets that many small files (4 messages each, written
with pyarrow, added by one Delta commit with their stats and marks, then checkpointed: filling takes
seconds), then one :class:`~engine.store.commit_log.CommitLogWriter` (host lock off) appends
``--repeat`` times. Rows
(median and p90 wall time, median process CPU, per append):

- ``append 1`` / ``append 512``: the writer's append of one / 512 messages of 1 KiB (committed
  directly, :mod:`engine.store.delta.direct_append`; with ``MQ_DIRECT_APPEND=0`` through delta-rs);
- ``append 1 + mq.tx``: one message with a transaction guard (``app_transactions``, always through
  delta-rs);
- ``256 appends, renewal`` / ``256 appends, no renewal``: one message each, 256 times in a row, with
  the writer renewing its DeltaTable handle once it has aged (``Snapshot.aged``), and without
  (a handle that commits gets slower with every version it moves on by);
- ``  open handle``: opening the commit log (what a renewal costs);
- ``  write_deltalake``: the bare delta-rs append the writer makes (same properties, hooks off);
- ``  create_write_txn``: the alternative of writing the parquet file with pyarrow and committing its
  add action through ``DeltaTable.create_write_transaction`` (delta-rs retries left on: with
  ``max_commit_retries=0`` that call fails with "Failed to commit transaction: 0" in deltalake 1.6.6);
- ``  parquet write``: pyarrow writing the one-message file alone;
- ``  transaction_version``: the guard's look-up of one app id;
- ``  update_incremental``: refreshing a second handle by one version.

``--profile`` prints a cProfile (by own time) of the single-message appends at the largest count.
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import io
import json
import os
import pstats
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from deltalake import CommitProperties, DeltaTable, PostCommitHookProperties, write_deltalake  # noqa: E402
from deltalake.transaction import AddAction, RemoveAction  # noqa: E402

from engine import Store  # noqa: E402
from engine.store import schemas  # noqa: E402
from engine.store.commit_log import CommitLogWriter  # noqa: E402
from engine.store.commit_log.hwm import read_hwm  # noqa: E402
from engine.store.commit_log.stamping import HighWaterMarks, PendingBatch, PendingMessage, stamp  # noqa: E402
from engine.store.commit_markers import HWM_KEY  # noqa: E402
from engine.store.delta import Snapshot  # noqa: E402


def _raw(store: Store) -> DeltaTable:
    """A bare delta-rs handle on the commit log: the peer the engine's own appends are measured against."""
    return DeltaTable(store.uri(schemas.COMMIT_LOG))


TOPIC = "CommitCost"
_NO_HOOKS = PostCommitHookProperties(create_checkpoint=False, cleanup_expired_logs=False)


def _add_action(table_dir: str, table: pa.Table) -> AddAction:
    """Write ``table`` as one parquet file of the table; its add action with min/max/null stats."""
    name = f"part-{uuid.uuid4()}.parquet"
    path = os.path.join(table_dir, name)
    pq.write_table(table, path)
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    for f in table.schema:
        if pa.types.is_integer(f.type) or pa.types.is_string(f.type):
            bounds = pc.min_max(table[f.name]).as_py()
            if bounds["min"] is not None:
                mins[f.name], maxs[f.name] = bounds["min"], bounds["max"]
            nulls[f.name] = table[f.name].null_count
    stats = {"numRecords": table.num_rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls}
    st = os.stat(path)
    return AddAction(name, st.st_size, {}, int(st.st_mtime * 1000), True, json.dumps(stats))


def _fill(store: Store, files: int, body: bytes) -> None:
    dt = _raw(store)
    hwm = read_hwm(store.snapshot(schemas.COMMIT_LOG))
    actions: list[AddAction | RemoveAction] = []
    for f in range(files):
        msgs = [PendingMessage(TOPIC, i % 4, body, f"fill-{f}-{i}") for i in range(4)]
        table, _, delta = stamp(msgs, hwm, store.store_id, int(time.time() * 1000))
        hwm.apply(delta)
        actions.append(_add_action(store.uri(schemas.COMMIT_LOG), table))
    dt.create_write_transaction(
        actions,
        mode="append",
        schema=schemas.COMMIT_LOG_SCHEMA,
        commit_properties=CommitProperties(custom_metadata={HWM_KEY: hwm.to_json()}),
        post_commithook_properties=_NO_HOOKS,
    )
    # A live commit log has a checkpoint at most 100 versions back (the writer takes one every
    # delta.checkpointInterval); without it every look-up would replay the fill commit's JSON.
    _raw(store).create_checkpoint()


def _timed(fn: Callable[[], object], repeat: int) -> tuple[list[float], list[float]]:
    wall, cpu = [], []
    for _ in range(repeat):
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append((time.perf_counter() - w0) * 1000)
        cpu.append((time.process_time() - c0) * 1000)
    return wall, cpu


def _row(name: str, files: int, timings: tuple[list[float], list[float]]) -> str:
    wall, cpu = timings
    p90 = sorted(wall)[min(len(wall) - 1, int(len(wall) * 0.9))]
    return (
        f"{files:>6}  {name:<22} p50 {statistics.median(wall):6.1f} ms  p90 {p90:6.1f} ms"
        f"  cpu {statistics.median(cpu):6.1f} ms"
    )


class _Raw:
    """Bare delta-rs appends of one stamped message, outside the writer."""

    def __init__(self, store: Store, body: bytes) -> None:
        self.store = store
        self.dt = _raw(store)
        self.hwm: HighWaterMarks = read_hwm(store.snapshot(schemas.COMMIT_LOG))
        self.one = PendingBatch.of([PendingMessage(TOPIC, 0, body, "raw")])

    def _next(self) -> tuple[pa.Table, CommitProperties]:
        # Only this handle writes while it is timed: it stays current, as the writer's does.
        table, _, delta = stamp(self.one, self.hwm, self.store.store_id, int(time.time() * 1000))
        self.hwm.apply(delta)
        props = CommitProperties(custom_metadata={HWM_KEY: self.hwm.to_json()}, max_commit_retries=0)
        return table, props

    def write_deltalake(self) -> None:
        table, props = self._next()
        write_deltalake(
            self.dt, table, mode="append", commit_properties=props, post_commithook_properties=_NO_HOOKS
        )

    def create_write_transaction(self) -> None:
        table, _ = self._next()
        action = _add_action(self.store.uri(schemas.COMMIT_LOG), table)
        self.dt.create_write_transaction(
            [action],
            mode="append",
            schema=schemas.COMMIT_LOG_SCHEMA,
            commit_properties=CommitProperties(custom_metadata={HWM_KEY: self.hwm.to_json()}),
            post_commithook_properties=_NO_HOOKS,
        )


def run(files: int, repeat: int, profile: bool) -> list[str]:
    root = tempfile.mkdtemp(prefix="commit-cost-")
    try:
        store = Store.open(root)
        body = os.urandom(1024)
        _fill(store, files, body)
        writer = CommitLogWriter(store, host_lock=False)
        one = PendingBatch.of([PendingMessage(TOPIC, 0, body, "one")])
        many = PendingBatch.of([PendingMessage(TOPIC, i % 4, body, f"m{i}") for i in range(512)])
        writer.append_batch(one)  # loads the snapshot outside the timings
        rows = []
        prof = cProfile.Profile() if profile else None
        if prof is not None:
            prof.enable()
        rows.append(_row("append 1", files, _timed(lambda: writer.append_batch(one), repeat)))
        if prof is not None:
            prof.disable()
        rows.append(_row("append 512", files, _timed(lambda: writer.append_batch(many), repeat)))
        guards = iter(range(10**9))
        rows.append(
            _row(
                "append 1 + mq.tx",
                files,
                _timed(
                    lambda: writer.append_batch(one, app_transactions={f"mq.tx.{next(guards)}": 1}), repeat
                ),
            )
        )
        for label, renew in (("256 appends, renewal", True), ("256 appends, no renewal", False)):
            aging = CommitLogWriter(store, host_lock=False)
            saved = Snapshot.aged
            if not renew:
                Snapshot.aged = property(lambda self: False)  # type: ignore[method-assign,assignment]
            try:
                rows.append(_row(label, files, _timed(functools.partial(aging.append_batch, one), 256)))
            finally:
                Snapshot.aged = saved  # type: ignore[method-assign]
        rows.append(_row("  open handle", files, _timed(lambda: _raw(store), 5)))
        raw = _Raw(store, body)
        rows.append(_row("  write_deltalake", files, _timed(raw.write_deltalake, repeat)))
        rows.append(_row("  create_write_txn", files, _timed(raw.create_write_transaction, repeat)))
        table, _ = raw._next()
        scratch = os.path.join(root, "scratch.parquet")
        rows.append(_row("  parquet write", files, _timed(lambda: pq.write_table(table, scratch), repeat)))
        rows.append(
            _row(
                "  transaction_version", files, _timed(lambda: raw.dt.transaction_version("mq.tx.0"), repeat)
            )
        )
        other = DeltaTable(store.uri(schemas.COMMIT_LOG))

        def refresh() -> None:
            writer.append_batch(one)
            w0, c0 = time.perf_counter(), time.process_time()
            other.update_incremental()
            refreshed.append(((time.perf_counter() - w0) * 1000, (time.process_time() - c0) * 1000))

        refreshed: list[tuple[float, float]] = []
        _timed(refresh, repeat)
        rows.append(
            _row("  update_incremental", files, ([w for w, _ in refreshed], [c for _, c in refreshed]))
        )
        if prof is not None:
            out = io.StringIO()
            pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(10)
            rows.append(out.getvalue())
        return rows
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--files", type=int, nargs="+", default=[50, 200, 800, 2000])
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    for files in args.files:
        for row in run(files, args.repeat, args.profile and files == max(args.files)):
            print(row, flush=True)


if __name__ == "__main__":
    main()
