"""Many producer processes appending to one store at once: throughput, fairness, lost races.

    python bench/contention.py [--writers 1 3 8] [--sends 150] [--batch 1] [--shards 1]

Each writer is its own process with its own :class:`~engine.Producer`; all start together and send
``--sends`` synchronous sends of ``--batch`` 1 KiB messages each (``send`` when ``--batch`` is 1,
``send_batch`` otherwise). Reported per writer count: aggregate msg/s (all messages / wall time from
the first send to the last acknowledgement), the p50 / p99 / max latency of a single append (the
max is the longest any writer waited), lost races (``CommitLogWriter.conflicts``) and sends that gave
up with ``CommitConflictError``. ``--no-lock`` turns the sequencer's inter-process lock off
(``MQ_SEQUENCER_LOCK=0``), leaving the optimistic protocol alone. ``--shards N`` makes the store
with N commit-log shards (the topic's 8 queues spread over them).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TOPIC = "Contention"


def _writer(root: str, worker: int, sends: int, batch: int, start: Any, out: Any, shards: int = 1) -> None:
    from engine import CommitConflictError, Message, Producer, Store, load_config

    store = Store.open(root, config=load_config(commit_log_shards=shards))
    body = os.urandom(1024)
    latencies: list[float] = []
    gave_up = 0
    with Producer(store) as producer:
        producer.send(Message(TOPIC, body))  # warm-up: tables opened, topic cached
        start.wait()
        began = time.time()
        for i in range(sends):
            t = time.perf_counter()
            try:
                if batch == 1:
                    producer.send(Message(TOPIC, body, keys=(f"w{worker}-{i}",)))
                else:
                    producer.send_batch(
                        [Message(TOPIC, body, keys=(f"w{worker}-{i}-{j}",)) for j in range(batch)]
                    )
            except CommitConflictError:
                gave_up += 1
            latencies.append((time.perf_counter() - t) * 1000)
        ended = time.time()
        conflicts = producer._writer.conflicts
    out.put({"began": began, "ended": ended, "lat": latencies, "gave_up": gave_up, "conflicts": conflicts})


def run(writers: int, sends: int, batch: int, shards: int = 1) -> dict[str, Any]:
    from engine import Admin, Store, load_config

    workdir = Path(tempfile.mkdtemp(prefix="lakemq-contention-"))
    try:
        store = Store.open(workdir / "store", config=load_config(commit_log_shards=shards))
        Admin(store).create_topic(TOPIC, 8)
        created = sum(store.version(name) for name in store.commit_logs)
        ctx = mp.get_context("spawn")
        start, out = ctx.Event(), ctx.Queue()
        procs = [
            ctx.Process(target=_writer, args=(store.root, w, sends, batch, start, out, shards))
            for w in range(writers)
        ]
        for p in procs:
            p.start()
        time.sleep(0.5)
        # Writers warm up (open tables, one send) before the start signal.
        while sum(store.version(name) for name in store.commit_logs) < created + writers:
            time.sleep(0.05)
        start.set()
        results = [out.get(timeout=600) for _ in procs]
        for p in procs:
            p.join(60)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    lat = sorted(x for r in results for x in r["lat"])
    wall = max(r["ended"] for r in results) - min(r["began"] for r in results)
    return {
        "writers": writers,
        "shards": shards,
        "msg_s": round(writers * sends * batch / wall),
        "p50_ms": round(lat[len(lat) // 2], 1),
        "p99_ms": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))], 1),
        "max_ms": round(lat[-1], 1),
        "conflicts": sum(r["conflicts"] for r in results),
        "gave_up": sum(r["gave_up"] for r in results),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writers", type=int, nargs="+", default=[1, 3, 8])
    parser.add_argument("--sends", type=int, default=150, help="sends per writer")
    parser.add_argument("--batch", type=int, default=1, help="messages per send")
    parser.add_argument("--no-lock", action="store_true", help="optimistic protocol only")
    parser.add_argument("--shards", type=int, default=1, help="commit-log shards of the store")
    args = parser.parse_args()
    if args.no_lock:
        os.environ["MQ_SEQUENCER_LOCK"] = "0"
    for n in args.writers:
        print(json.dumps(run(n, args.sends, args.batch, args.shards)), flush=True)
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)
