"""A broker job's query whose progress counts the rows its driver read (Spark sees none).

The jobs that follow a table (:mod:`engine.spark.jobs.streams`) read its versions on the driver, so
Spark's progress reports 0 input rows; :class:`CountedQuery` puts back the rows each batch read.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from engine.spark.progress import progress_dict

# Batches whose row counts a CountedQuery remembers (Spark keeps the last 100 progresses).
REMEMBERED_BATCHES = 1000


class BatchRows:
    """The source rows each micro-batch read, and when it began (``time.monotonic()``)."""

    def __init__(self, remembered: int = REMEMBERED_BATCHES) -> None:
        self._batches: OrderedDict[int, tuple[int, float]] = OrderedDict()
        self._remembered = remembered
        self._lock = threading.Lock()

    def record(self, batch_id: int, rows: int, started: float) -> None:
        with self._lock:
            self._batches[batch_id] = (rows, started)
            while len(self._batches) > self._remembered:
                self._batches.popitem(last=False)

    def get(self, batch_id: int) -> tuple[int, float] | None:
        with self._lock:
            return self._batches.get(batch_id)


class CountedQuery:
    """A job's ``StreamingQuery`` whose progress counts the source rows each batch handled.

    Spark counts a micro-batch's input rows only when a Spark job reads them; the jobs that follow
    a table read its versions on the driver, so Spark reports 0 rows for every batch. ``lastProgress`` and
    ``recentProgress`` (as dicts) carry instead the source rows each batch read, and the rates
    derived from them, so progress lines, ``_status/dispatch.json`` and their end-to-end delay stay
    meaningful. Everything else is the query's own.
    """

    def __init__(self, query: Any, batches: BatchRows) -> None:
        self._query = query
        self._batches = batches

    def __getattr__(self, name: str) -> Any:
        return getattr(self._query, name)

    def __repr__(self) -> str:
        return f"CountedQuery({self._query!r})"

    def _counted(self, progress: Any) -> dict[str, Any] | None:
        p = progress_dict(progress)
        if p is None or p.get("batchId") is None:
            return p
        batch_id = int(p["batchId"])
        seen, previous = self._batches.get(batch_id), self._batches.get(batch_id - 1)
        if seen is None:
            return p
        rows, started = seen
        trigger_ms = (p.get("durationMs") or {}).get("triggerExecution")
        interval_s = started - previous[1] if previous is not None else None
        p["numInputRows"] = rows
        p["processedRowsPerSecond"] = rows * 1000.0 / trigger_ms if trigger_ms else 0.0
        p["inputRowsPerSecond"] = rows / interval_s if interval_s else 0.0
        for source in p.get("sources") or ():
            source.update(
                numInputRows=rows,
                processedRowsPerSecond=p["processedRowsPerSecond"],
                inputRowsPerSecond=p["inputRowsPerSecond"],
            )
        return p

    @property
    def lastProgress(self) -> dict[str, Any] | None:
        return self._counted(self._query.lastProgress)

    @property
    def recentProgress(self) -> list[dict[str, Any]]:
        return [p for p in (self._counted(x) for x in self._query.recentProgress) if p is not None]
