"""Observability of the broker's streaming jobs: their progress, as log lines and status files.

A job's progress comes from its ``StreamingQuery`` (``lastProgress``, polled on a thread by
:class:`ProgressMonitor`, so it works the same under Spark Connect): rows per second, batch duration
and, for jobs fed by a table's log, the end-to-end delay — the time the batch finished minus the
newest store time among its rows (the commit log's high-water mark, ``mq.marks`` or ``mq.hwm``, of
the batch's last version; for other tables that commit's timestamp).

Each job's last progress becomes a :class:`~engine.store.status.JobStatus` written to
``<store>/_status/<job>.json`` by :mod:`engine.store.status`, which ``mq status`` and the dashboard
read without Spark. Nothing here starts a JVM: it reads the progress of queries already running.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

from engine.errors import StoreError
from engine.store import schemas
from engine.store.commit_markers import HWM_KEY, MARKS_KEY
from engine.store.delta import read_version
from engine.store.status import RUNNING, JobStatus, write_status
from engine.store.store import Store, now_ms

LOGGER = logging.getLogger("lakemq.broker")


# ----------------------------------------------------------------------------- reading a progress
def progress_dict(progress: Any) -> dict[str, Any] | None:
    """A ``StreamingQueryProgress`` (or the dict older Sparks return) as a plain dict."""
    if progress is None:
        return None
    text = getattr(progress, "json", None)
    if isinstance(text, str):
        loaded: dict[str, Any] = json.loads(text)
        return loaded
    if isinstance(progress, Mapping):
        return dict(progress)
    return None


def _version_of(offset: Any) -> int | None:
    if isinstance(offset, str):
        try:
            offset = json.loads(offset)
        except ValueError:
            return None
    if isinstance(offset, Mapping) and isinstance(offset.get("version"), int):
        return int(offset["version"])
    if isinstance(offset, Mapping) and isinstance(offset.get("reservoirVersion"), int):
        # Delta's offset: at ``index`` -1 nothing of ``reservoirVersion`` is read yet.
        version = int(offset["reservoirVersion"])
        return version - 1 if offset.get("index") == -1 else version
    return None


def end_version(progress: Mapping[str, Any]) -> int | None:
    """The last table version a micro-batch of ``deltalog`` or Delta's source reached (its end
    offset), if it read one."""
    versions = [_version_of(s.get("endOffset")) for s in progress.get("sources") or ()]
    known = [v for v in versions if v is not None]
    return max(known) if known else None


def _parse_timestamp_ms(text: str | None) -> int | None:
    if not text:
        return None
    try:
        stamp = _dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return int(stamp.timestamp() * 1000)


@lru_cache(maxsize=1024)
def _newest_store_time(
    uri: str, table: str, version: int, options: tuple[tuple[str, str], ...]
) -> int | None:
    try:
        info = read_version(uri, version, dict(options) or None).commit_info
    except StoreError:
        return None
    for key in (MARKS_KEY, HWM_KEY):
        if schemas.shard_of_table(table) is not None and key in info:
            try:
                return int(json.loads(str(info[key]))["t"])
            except (ValueError, KeyError, TypeError):
                pass
    stamp = info.get("timestamp")
    return int(stamp) if isinstance(stamp, int) else None


def newest_store_time(store: Store, table: str, version: int) -> int | None:
    """Newest store time of the rows a table holds as of ``version`` (from that commit's info)."""
    options = tuple(sorted((store.storage_options or {}).items()))
    return _newest_store_time(store.uri(table), table, version, options)


def status_from_progress(
    job: str,
    progress: Mapping[str, Any],
    *,
    state: str = RUNNING,
    store: Store | None = None,
    source_table: str | None = None,
    total_input_rows: int = 0,
    batches: int = 0,
) -> JobStatus:
    """A :class:`JobStatus` from one query progress.

    The end-to-end delay is computed only for a batch that read rows from ``source_table``'s log.
    """
    rows = int(progress.get("numInputRows") or 0)
    duration = progress.get("batchDuration")
    delay = None
    version = end_version(progress)
    started = _parse_timestamp_ms(progress.get("timestamp"))
    if rows and store is not None and source_table is not None and version is not None and started:
        newest = newest_store_time(store, source_table, version)
        if newest is not None:
            delay = max(0, started + int(duration or 0) - newest)
    in_rate, out_rate = progress.get("inputRowsPerSecond"), progress.get("processedRowsPerSecond")
    return JobStatus(
        job=job,
        state=state,
        updated_ms=now_ms(),
        batch_id=int(progress["batchId"]) if progress.get("batchId") is not None else None,
        num_input_rows=rows,
        input_rows_per_second=float(in_rate) if isinstance(in_rate, int | float) else None,
        processed_rows_per_second=float(out_rate) if isinstance(out_rate, int | float) else None,
        batch_duration_ms=int(duration) if duration is not None else None,
        end_to_end_delay_ms=delay,
        batch_timestamp=progress.get("timestamp"),
        total_input_rows=total_input_rows,
        batches=batches,
        query_name=progress.get("name"),
    )


def query_status(
    job: str,
    query: Any,
    *,
    state: str,
    store: Store | None = None,
    source_table: str | None = None,
    detail: str | None = None,
) -> JobStatus:
    """The status of a query as it stands (its last progress, totals over its recent progress)."""
    recent = [p for p in (progress_dict(x) for x in (getattr(query, "recentProgress", None) or ())) if p]
    last = progress_dict(getattr(query, "lastProgress", None))
    total = sum(int(p.get("numInputRows") or 0) for p in recent)
    if last is None:
        return JobStatus(job, state, now_ms(), detail=detail)
    status = status_from_progress(
        job,
        last,
        state=state,
        store=store,
        source_table=source_table,
        total_input_rows=total,
        batches=len(recent),
    )
    return replace(status, detail=detail) if detail else status


# ----------------------------------------------------------------------------- live monitoring
@dataclass
class _Watched:
    query: Any
    source_table: str | None
    last_batch: int = -1
    # When the last line / status was, on the monitor's clock; None: never. Not 0.0: time.monotonic()
    # counts from boot, so on a machine up for less than a heartbeat "0.0" would be "just now".
    last_logged: float | None = None
    last_written: float | None = None
    total_rows: int = 0
    batches: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


class ProgressMonitor:
    """Polls running queries' ``lastProgress``; logs progress lines and writes status files.

    A batch that read rows is logged and written at once; idle batches (tickers, empty polls) at most
    every ``heartbeat_s``, so a 250 ms ticker does not flood the log.

    Args:
        store: where status files go.
        interval_s: polling period.
        heartbeat_s: least time between two lines (and status writes) for idle batches.
        log: where lines go (default the ``lakemq.broker`` logger at INFO).
        clock: seconds on a monotonic clock (default ``time.monotonic``; tests pass their own).
    """

    def __init__(
        self,
        store: Store,
        *,
        interval_s: float = 1.0,
        heartbeat_s: float = 30.0,
        log: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._clock = clock
        self._interval = interval_s
        self._heartbeat = heartbeat_s
        self._log = log or LOGGER.info
        self._watched: dict[str, _Watched] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, job: str, query: Any, source_table: str | None = None) -> None:
        """Follow ``query`` as ``job`` (whose rows come from ``source_table``'s log, if any)."""
        self._watched[job] = _Watched(query, source_table)
        write_status(self._store, JobStatus(job, RUNNING, now_ms(), query_name=_name(query)))

    def poll(self) -> list[JobStatus]:
        """Look at every query once; returns the statuses written."""
        written = []
        for job, w in list(self._watched.items()):
            with w.lock:
                progress = progress_dict(getattr(w.query, "lastProgress", None))
                if progress is None or int(progress.get("batchId", -1)) <= w.last_batch:
                    continue
                batch_id = int(progress["batchId"])
                fresh = [progress]
                if w.last_batch >= 0 and batch_id > w.last_batch + 1:  # batches finished between polls
                    recent = (progress_dict(p) for p in getattr(w.query, "recentProgress", None) or ())
                    fresh = [p for p in recent if p and w.last_batch < int(p.get("batchId", -1)) <= batch_id]
                w.last_batch = batch_id
                rows = sum(int(p.get("numInputRows") or 0) for p in fresh)
                w.total_rows += rows
                w.batches += len(fresh)
                status = status_from_progress(
                    job,
                    progress,
                    store=self._store,
                    source_table=w.source_table,
                    total_input_rows=w.total_rows,
                    batches=w.batches,
                )
                now = self._clock()
                if rows or _due(w.last_logged, now, self._heartbeat):
                    self._log(status.line())
                    w.last_logged = now
                if rows or _due(w.last_written, now, min(self._heartbeat, 5.0)):
                    write_status(self._store, status)
                    w.last_written = now
                    written.append(status)
        return written

    def finish(self, job: str, state: str, detail: str | None = None) -> JobStatus:
        """Record a query's end (stopped, failed, finished) as its final status."""
        w = self._watched.get(job)
        if w is None:
            status = JobStatus(job, state, now_ms(), detail=detail)
        else:
            with w.lock:
                last = progress_dict(getattr(w.query, "lastProgress", None))
                if last is None:
                    status = JobStatus(job, state, now_ms(), query_name=_name(w.query), detail=detail)
                else:
                    status = status_from_progress(
                        job,
                        last,
                        state=state,
                        store=self._store,
                        source_table=w.source_table,
                        total_input_rows=w.total_rows,
                        batches=w.batches,
                    )
                    status = replace(status, detail=detail) if detail else status
        write_status(self._store, status)
        self._log(status.line())
        return status

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.poll()
            except Exception as exc:  # observability must never take the broker down
                LOGGER.warning("progress monitor: %s", exc)

    def start(self) -> ProgressMonitor:
        """Poll on a daemon thread until :meth:`stop`."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="lakemq-progress", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop polling (after one last poll)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        try:
            self.poll()
        except Exception as exc:
            LOGGER.warning("progress monitor: %s", exc)


def _due(last: float | None, now: float, every_s: float) -> bool:
    """Whether something done at ``last`` (None: never) is due again at ``now``."""
    return last is None or now - last >= every_s


def _name(query: Any) -> str | None:
    try:
        name = query.name
    except Exception:
        return None
    return str(name) if name is not None else None
