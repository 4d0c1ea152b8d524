"""Message selectors: vectorised SQL92 evaluation over Arrow, and pulls that filter.

    python bench/selector_filters.py [--rows 100000] [--repeat 5] [--store-messages 20000] [--pulls 200]

Part 1 evaluates selectors over one in-memory batch of ``--rows`` commit-log rows (tags and a
properties map of five entries, as the commit log stores them) and reports rows/s of
:meth:`MessageSelector.matches` (the median of ``--repeat`` runs), beside the same condition written as
a plain Python function applied row by row to the decoded rows, with and without the cost of
decoding the Arrow rows to Python (what a row-at-a-time evaluator pays at least). Part 2 fills a
one-queue store with ``--store-messages``
1 KiB messages and times ``--pulls`` pulls of 32 from random offsets with no filter, a tag filter
and SQL92 filters of different selectivity (p50 / p99 ms). Prints one JSON line per measurement.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from engine import Admin, Message, MessageSelector, Producer, PullConsumer, Store  # noqa: E402
from engine.broker.dispatch import dispatch_pending  # noqa: E402

REGIONS = ["eu", "us", "apac", "latam"]
TAGS = ["Paid", "Created", "Shipped", "Refunded"]


def _props(i: int) -> dict[str, str]:
    props = {"amount": str(i % 1000), "region": REGIONS[i % 4], "user": f"user-{i % 5000}", "seq": str(i)}
    if i % 10:
        props["flag"] = "true" if i % 3 else "false"
    return props


def _float(value: str | None) -> float | None:
    try:
        return None if value is None else float(value)
    except ValueError:
        return None


# expression, the same condition row by row in Python (rows as dicts of tags + properties)
CASES: list[tuple[str, Callable[[dict[str, Any]], bool]]] = [
    ("region = 'eu'", lambda r: r["p"].get("region") == "eu"),
    ("amount > 500", lambda r: (_float(r["p"].get("amount")) or 0) > 500),
    (
        "TAGS = 'Paid' AND amount BETWEEN 100 AND 900 AND region IN ('eu', 'us')",
        lambda r: (
            r["t"] == "Paid"
            and 100 <= (_float(r["p"].get("amount")) or -1) <= 900
            and r["p"].get("region") in ("eu", "us")
        ),
    ),
    (
        "user STARTSWITH 'user-1' OR flag IS NULL",
        lambda r: r["p"].get("user", "").startswith("user-1") or "flag" not in r["p"],
    ),
    (
        "NOT (amount > 500) AND flag = TRUE",
        lambda r: (_float(r["p"].get("amount")) or 0) <= 500 and r["p"].get("flag") == "true",
    ),
]


def batch(rows: int) -> pa.Table:
    props = [list(_props(i).items()) for i in range(rows)]
    return pa.table(
        {
            "tags": pa.array([TAGS[i % 4] for i in range(rows)], pa.string()),
            "properties": pa.array(props, pa.map_(pa.string(), pa.string())),
        }
    )


def evaluation(rows: int, repeat: int) -> list[dict[str, Any]]:
    table = batch(rows)
    began = time.perf_counter()
    tags, props = table["tags"].to_pylist(), table["properties"].to_pylist()
    decoded = [{"t": t, "p": dict(p)} for t, p in zip(tags, props, strict=True)]
    decode_s = time.perf_counter() - began
    out = []
    for expression, python in CASES:
        began = time.perf_counter()
        selector = MessageSelector.by_sql(expression)
        parse_ms = (time.perf_counter() - began) * 1000
        times = []
        for _ in range(repeat):
            began = time.perf_counter()
            mask = selector.matches(table)
            times.append(time.perf_counter() - began)
        began = time.perf_counter()
        expected = [python(r) for r in decoded]
        python_s = time.perf_counter() - began
        hits = mask.to_pylist()
        if hits != expected:
            raise AssertionError(f"{expression}: the selector and the Python reference disagree")
        median = statistics.median(times)
        out.append(
            {
                "bench": "evaluate",
                "expression": expression,
                "rows": rows,
                "matched": sum(hits),
                "parse_ms": round(parse_ms, 3),
                "median_ms": round(median * 1000, 2),
                "rows_per_s": round(rows / median),
                "python_rows_per_s": round(rows / python_s),
                "python_with_decode_rows_per_s": round(rows / (python_s + decode_s)),
                "speedup_vs_python_with_decode": round((python_s + decode_s) / median, 1),
            }
        )
    return out


def pulls(messages: int, count: int) -> list[dict[str, Any]]:
    workdir = Path(tempfile.mkdtemp(prefix="lakemq-selectors-"))
    try:
        store = Store.open(workdir / "mqdata")
        Admin(store).create_topic("S", 1)
        body = b"x" * 1024
        with Producer(store) as producer:
            for start in range(0, messages, 2000):
                producer.send_batch(
                    [
                        Message("S", body, tags=TAGS[i % 4], properties=_props(i))
                        for i in range(start, min(messages, start + 2000))
                    ],
                    queue_id=0,
                )
        dispatch_pending(store)
        consumer = PullConsumer(store, "bench")
        rng = random.Random(7)
        offsets = [rng.randrange(0, messages - 1000) for _ in range(count)]
        out = []
        for label, expression in [
            ("all", "*"),
            ("tag 1/4", "Paid"),
            ("sql 1/4", MessageSelector.by_sql("region = 'eu'")),
            ("sql 1/40", MessageSelector.by_sql("region = 'eu' AND amount < 100")),
            ("sql 1/800", MessageSelector.by_sql("amount = 7 AND region = 'us'")),
        ]:
            consumer.pull("S", 0, 0, expression=expression)  # warm caches
            samples = []
            found = 0
            for offset in offsets:
                began = time.perf_counter()
                result = consumer.pull("S", 0, offset, expression=expression)
                samples.append((time.perf_counter() - began) * 1000)
                found += len(result.messages)
            samples.sort()
            out.append(
                {
                    "bench": "pull32",
                    "filter": label,
                    "store_messages": messages,
                    "pulls": count,
                    "messages_per_pull": round(found / count, 1),
                    "p50_ms": round(samples[len(samples) // 2], 2),
                    "p99_ms": round(samples[min(len(samples) - 1, int(len(samples) * 0.99))], 2),
                }
            )
        return out
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--store-messages", type=int, default=20_000)
    parser.add_argument("--pulls", type=int, default=200)
    args = parser.parse_args()
    for line in evaluation(args.rows, args.repeat):
        print(json.dumps(line), flush=True)
    if args.store_messages:
        for line in pulls(args.store_messages, args.pulls):
            print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
