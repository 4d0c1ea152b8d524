"""Pure helpers of the benchmark: percentiles, latency and rate summaries, ratios.

A measurement is a plain dict so that it goes to JSON unchanged:

* latency: ``{"p50_ms", "p99_ms", "mean_ms", "n"}``;
* rate: ``{"msg_s", "n", "seconds"}``;
* absent: ``{"unavailable": "<why>"}`` (a peer that could not run, or has no such operation).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

Measure = dict[str, Any]


def percentile(samples: Sequence[float], p: float) -> float:
    """The p-th percentile of ``samples`` by nearest rank (NaN when there are none)."""
    if not 0 <= p <= 100:
        raise ValueError(f"percentile {p} is outside 0..100")
    ordered = sorted(samples)
    if not ordered:
        return float("nan")
    rank = math.ceil(p / 100 * len(ordered))
    return ordered[min(max(rank, 1), len(ordered)) - 1]


def latency(samples_ms: Sequence[float]) -> Measure:
    """Median, p99 and mean of latencies in milliseconds."""
    if not samples_ms:
        return unavailable("no samples")
    return {
        "p50_ms": round(percentile(samples_ms, 50), 3),
        "p99_ms": round(percentile(samples_ms, 99), 3),
        "mean_ms": round(statistics.fmean(samples_ms), 3),
        "n": len(samples_ms),
    }


def rate(messages: int, seconds: float) -> Measure:
    """Throughput of ``messages`` handled in ``seconds``."""
    if seconds <= 0:
        raise ValueError(f"a rate needs a positive duration, got {seconds}")
    return {"msg_s": round(messages / seconds), "n": messages, "seconds": round(seconds, 3)}


def unavailable(why: str) -> Measure:
    """A measurement that was not taken, and why."""
    return {"unavailable": why}


def is_available(measure: Mapping[str, Any] | None) -> bool:
    return measure is not None and "unavailable" not in measure


_SUMMED = ("n", "seconds", "failures", "missing")
"""What the runs of one measurement add up to: samples, messages, time, sends failed, messages
missed (every other number of a measurement is the runs' median)."""


def median_measure(runs: Sequence[Measure]) -> Measure:
    """One measurement of several runs of it: each figure the median of the runs that were taken
    (``n``, ``seconds``, ``failures`` and ``missing`` their sum), and ``runs`` how many; the first
    run's reason when none was taken.

    Raises:
        ValueError: no runs.
    """
    if not runs:
        raise ValueError("a median of no runs")
    taken = [m for m in runs if is_available(m)]
    if not taken:
        return dict(runs[0])
    out: Measure = {}
    for key in dict.fromkeys(k for m in taken for k in m):
        values = [m[key] for m in taken if key in m]
        if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
            out[key] = values[0]
        elif key in _SUMMED:
            out[key] = round(sum(values), 3)
        else:
            middle = statistics.median(values)
            out[key] = round(middle, 3) if isinstance(middle, float) else middle
    out["runs"] = len(taken)
    return out


def timed_ms(
    fn: Callable[[int], Any], n: int, budget_s: float | None = None, min_samples: int = 20
) -> list[float]:
    """Call ``fn(0..n-1)`` one after another; the duration of each call in milliseconds.

    With ``budget_s``, stops early once that much time has gone by and ``min_samples`` were taken
    (a very slow peer then costs bounded time; the sample count says how many were taken).
    """
    samples: list[float] = []
    started = time.perf_counter()
    for i in range(n):
        began = time.perf_counter()
        fn(i)
        now = time.perf_counter()
        samples.append((now - began) * 1000)
        if budget_s is not None and len(samples) >= min_samples and now - started > budget_s:
            break
    return samples


def headline(measure: Mapping[str, Any]) -> float | None:
    """The number a measurement is compared by: msg/s for a rate, the median for a latency."""
    if not is_available(measure):
        return None
    if "msg_s" in measure:
        return float(measure["msg_s"])
    return float(measure["p50_ms"])


def ratio(ours: Mapping[str, Any], peer: Mapping[str, Any] | None) -> float | None:
    """How lakemq compares with a peer on the headline number.

    For a rate, ours / peer (0.5 = half the peer's throughput); for a latency, ours / peer of the
    medians (3.0 = three times the peer's latency). None when either side is missing or zero.
    """
    if peer is None:
        return None
    a, b = headline(ours), headline(peer)
    if a is None or b is None or b == 0:
        return None
    return a / b


def cpu_ceiling(server_ms_1k: float, client_ms_1k: float, cores: int) -> float:
    """The highest rate (msg/s) at which a server and a client spending so much CPU per 1,000
    messages could run on ``cores`` cores, busy all the time."""
    spent = server_ms_1k + client_ms_1k
    return cores * 1_000_000 / spent if spent > 0 else float("inf")
