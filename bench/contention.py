"""Many producer processes appending to one store at once: throughput, fairness, lost races.

    python bench/contention.py [--writers 1 3 8] [--sends 150] [--batch 1] [--no-lock] [--shards 1]

A command line over :mod:`bench.workloads.contention` (also the ``contention`` step of
``bench/run.py``): one JSON line per writer count with aggregate msg/s, the p50 / p99 / max latency
of one send (the max is the longest any writer waited), lost races and sends that gave up with
``CommitConflictError``. ``--no-lock`` turns the sequencer's inter-process lock off
(``MQ_SEQUENCER_LOCK=0``), leaving the optimistic protocol alone; ``--shards`` creates the store
with that many commit-log shards (once the engine has them).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.workloads.contention import run  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--writers", type=int, nargs="+", default=[1, 3, 8])
    parser.add_argument("--sends", type=int, default=150, help="sends per writer")
    parser.add_argument("--batch", type=int, default=1, help="messages per send")
    parser.add_argument("--no-lock", action="store_true", help="optimistic protocol only")
    parser.add_argument("--shards", type=int, default=1, help="commit-log shards of the store")
    args = parser.parse_args()
    for n in args.writers:
        measure = run(n, args.sends, args.batch, lock=not args.no_lock, shards=args.shards)
        print(json.dumps(measure), flush=True)
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)
