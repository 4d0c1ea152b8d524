"""The garbage collector of a long-running server process (``mq serve`` and its broker process).

CPython's default thresholds collect the youngest generation every 700 new container objects. A
wire batch of 32 messages makes a few thousand (its messages, their properties, the columns of
its commit), so the server collected several times a batch; with everything the server holds by
then (recent messages, kept files, a Spark-less but large import graph) a collection costs more
than the objects it frees, about a twentieth of the door's time under batch sends. Nearly all
of those objects are freed by reference counting; only cycles need the collector, and a server
makes few. :func:`tune_for_serving` collects the young generation every 20,000 objects instead
and freezes what start-up made (imports, configuration, the store's first snapshots) out of every
later collection.
"""

from __future__ import annotations

import gc

SERVING_THRESHOLDS = (20_000, 20, 20)
"""Collect the young generation every 20,000 new container objects (CPython: 700), the middle one
every 20 of those, the oldest every 20 of the middle ones (and only once a quarter of it is new)."""


def tune_for_serving() -> None:
    """Set this process's collector for serving (:data:`SERVING_THRESHOLDS`) after one full
    collection, and freeze what survives it: call it once start-up is done. For processes that
    serve, never from a library call (the thresholds are the whole process's)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*SERVING_THRESHOLDS)
