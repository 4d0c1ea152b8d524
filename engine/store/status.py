"""The status files of the store's jobs and the size of its tables: what ``mq status`` and the
dashboard show.

Each job writes its last progress to ``<store>/_status/<job>.json`` (small JSON, replaced atomically
on a local store): the Spark jobs through :class:`engine.spark.progress.ProgressMonitor`, the broker
app for its own lifecycle. Table sizes come from each table's snapshot (its add actions; no data file
is read). Nothing here starts Spark: a process without a JVM reads statuses and sizes.
"""

from __future__ import annotations

import datetime as _dt
import json
from dataclasses import asdict, dataclass, fields
from typing import Any

from engine.errors import StoreError
from engine.store.delta import get_object, list_objects, put_object
from engine.store.store import Store

STATUS_DIR = "_status"

# Job states written to a status file.
RUNNING = "running"
FINISHED = "finished"  # a --once run that completed
STOPPED = "stopped"  # a running query stopped on request
FAILED = "failed"
SKIPPED = "skipped"  # the job's module is missing


@dataclass(frozen=True)
class JobStatus:
    """The last progress of one job, as written to ``<store>/_status/<job>.json``."""

    job: str
    state: str
    updated_ms: int
    batch_id: int | None = None
    num_input_rows: int = 0
    input_rows_per_second: float | None = None
    processed_rows_per_second: float | None = None
    batch_duration_ms: int | None = None
    end_to_end_delay_ms: int | None = None
    batch_timestamp: str | None = None
    total_input_rows: int = 0  # over the batches this process has seen of the current run
    batches: int = 0
    query_name: str | None = None
    detail: str | None = None  # a failure, a skip reason, or a job's own summary

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> JobStatus:
        data = json.loads(text)
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def line(self) -> str:
        """One log line: rows, rates, batch duration, end-to-end delay."""
        parts = [f"{self.job}: {self.state}"]
        if self.batch_id is not None:
            parts.append(f"batch {self.batch_id}: {self.num_input_rows} rows")
        if self.processed_rows_per_second is not None:
            parts.append(f"{self.processed_rows_per_second:.1f} rows/s")
        if self.batch_duration_ms is not None:
            parts.append(f"batch {self.batch_duration_ms} ms")
        if self.end_to_end_delay_ms is not None:
            parts.append(f"end-to-end delay {self.end_to_end_delay_ms} ms")
        if self.detail:
            parts.append(self.detail)
        return ", ".join(parts)


def write_status(store: Store, status: JobStatus) -> None:
    """Write a job's status to ``<store>/_status/<job>.json`` (atomically on a local store, one
    upload on an object store).

    Raises:
        StoreError: it could not be written.
    """
    data = status.to_json().encode()
    put_object(store.root, f"{STATUS_DIR}/{status.job}.json", data, store.storage_options)


def read_statuses(store: Store) -> list[JobStatus]:
    """Every job status written under the store, sorted by job name (unreadable files skipped)."""
    try:
        infos = list_objects(store.root, STATUS_DIR, store.storage_options)
    except StoreError:
        return []
    out = []
    for info in infos:
        name = info.path.removeprefix(f"{STATUS_DIR}/")
        if "/" in name or not name.endswith(".json"):
            continue
        try:
            data = get_object(store.root, info.path, store.storage_options)
            if data is not None:
                out.append(JobStatus.from_json(data.decode()))
        except (StoreError, ValueError, TypeError):
            continue
    return sorted(out, key=lambda s: s.job)


@dataclass(frozen=True)
class TableSize:
    """The live snapshot of one table: version, data files, rows and bytes."""

    table: str
    version: int
    files: int
    rows: int
    bytes: int


def table_sizes(store: Store) -> list[TableSize]:
    """Size of every table of the store, each commit-log shard on its own row (from the snapshots'
    add actions; no data file is read)."""
    out = []
    for name in store.tables():
        snapshot = store.snapshot(name)
        actions = snapshot.add_actions()
        rows = sum(int(v or 0) for v in actions["num_records"].to_pylist()) if actions.num_rows else 0
        size = sum(int(v or 0) for v in actions["size_bytes"].to_pylist()) if actions.num_rows else 0
        out.append(TableSize(name, snapshot.version(), actions.num_rows, rows, size))
    return out


@dataclass(frozen=True)
class StoreStatus:
    """What ``mq status`` shows: the jobs' last progress and the tables' sizes."""

    jobs: list[JobStatus]
    tables: list[TableSize]

    JOB_COLUMNS = (
        "job",
        "state",
        "batch",
        "rows",
        "rows (run)",
        "rows/s",
        "batch ms",
        "delay ms",
        "updated",
        "detail",
    )
    TABLE_COLUMNS = ("table", "version", "files", "rows", "bytes")

    def job_rows(self) -> list[tuple[Any, ...]]:
        rows = []
        for s in self.jobs:
            updated = _dt.datetime.fromtimestamp(s.updated_ms / 1000).isoformat(sep=" ", timespec="seconds")
            rate = None if s.processed_rows_per_second is None else f"{s.processed_rows_per_second:.1f}"
            rows.append(
                (
                    s.job,
                    s.state,
                    s.batch_id,
                    s.num_input_rows,
                    s.total_input_rows,
                    rate,
                    s.batch_duration_ms,
                    s.end_to_end_delay_ms,
                    updated,
                    s.detail or "",
                )
            )
        return rows

    def table_rows(self) -> list[tuple[Any, ...]]:
        return [(t.table, t.version, t.files, t.rows, t.bytes) for t in self.tables]


def store_status(store: Store) -> StoreStatus:
    """The jobs' last progress and every table's size."""
    return StoreStatus(read_statuses(store), table_sizes(store))
