"""Run every benchmark workload in one process, side by side with the peers; write BENCHMARKS.md.

    bash bench/run.sh            # full run (~15 min on 2 cores): 1M-message store
    bash bench/run.sh --quick    # smoke run (~2-3 min): 50k-message store, short latency runs

Works unattended (no stdin). Everything it creates lives in one temporary directory that is removed
at the end, and the Redis server, the broker process, the real RocketMQ name server and broker and
`mq serve` it starts are stopped, also on an error, Ctrl-C or SIGTERM (the wire step, ``--only
wire``, needs Maven and Java 17: see bench/workloads/wire.py, as ``--only grpc`` does: see
bench/workloads/grpc.py; the object-storage step, ``--only s3``,
SeaweedFS built by bin/seaweedfs-build.sh: see bench/workloads/object_store.py). Results:
BENCHMARKS.md at the repository root and bench/results/latest.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: make bench/ and engine/ importable
    sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn  # noqa: E402
from rich.table import Table  # noqa: E402

from bench import machine, report  # noqa: E402
from bench.peers import RedisServer  # noqa: E402
from bench.workloads import (  # noqa: E402
    Context,
    Sizes,
    ack,
    contention,
    failover,
    flow,
    grpc,
    object_store,
    produce,
    pull,
    replay,
    topics,
    wire,
)

Step = Callable[[Context], list[dict[str, Any]]]
# (name, function, needs the big store built by "produce")
STEPS: tuple[tuple[str, Step, bool], ...] = (
    ("produce", produce.batched_produce, False),
    ("sync", produce.sync_send, False),
    ("async", produce.async_send, False),
    ("pull", pull.pulls, True),
    ("replay", replay.replay_throughput, False),
    ("flow", flow.flow, False),
    ("ack", ack.acks, False),
    ("failover", failover.failover, False),
    ("topics", topics.topics, False),
    ("flush", topics.sync_flush, False),
    ("contention", contention.contention, False),
    ("wire", wire.wire, False),
    ("grpc", grpc.grpc, False),
    ("s3", object_store.object_store, False),
)
DESCRIPTIONS = {
    "produce": "batched produce (builds the big store)",
    "sync": "single synchronous sends",
    "async": "async produce",
    "pull": "pulls before and after compaction",
    "replay": "Spark batch replay",
    "flow": "end to end and delayed delivery, broker running",
    "ack": "per-message ack: SimpleConsumer processes vs Redis XREADGROUP + XACK",
    "failover": "a consumer process killed: its queues taken over by the others",
    "topics": "topic creation, sends among 10,000 topics, commit metadata size",
    "flush": "synchronous sends with SYNC_FLUSH vs ASYNC_FLUSH",
    "contention": "8 writer processes racing for the commit log, with and without the host lock",
    "wire": "RocketMQ's Java client: mq serve vs the real RocketMQ broker",
    "grpc": "RocketMQ 5's official Python client: mq serve --grpc vs the real RocketMQ 5 proxy",
    "s3": "object storage (SeaweedFS on loopback, with and without 20 ms injected per request)",
}


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a ~2-minute smoke run with small sizes")
    parser.add_argument("--messages", type=int, help="messages in the big store (default 1M, --quick 50k)")
    parser.add_argument(
        "--only", default="", help=f"comma-separated steps to run ({','.join(s[0] for s in STEPS)})"
    )
    parser.add_argument("--no-redis", action="store_true", help="leave the Redis Streams peer out")
    parser.add_argument("--markdown", type=Path, default=ROOT / "BENCHMARKS.md", help="the report written")
    parser.add_argument(
        "--out", type=Path, default=ROOT / "bench" / "results" / "latest.json", help="JSON results"
    )
    parser.add_argument("--workdir", type=Path, default=None, help="parent of the temporary directory")
    parser.add_argument(
        "--render", type=Path, default=None, help="only write the report again from this JSON results file"
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (debugging)")
    parser.add_argument(
        "--update",
        action="store_true",
        help="measure only the --only steps again: their workloads replace those of the same ids in "
        "the --out results, the rest is kept, and the report says which steps were measured when",
    )
    args = parser.parse_args(argv)
    known = {s[0] for s in STEPS}
    args.steps = [s for s in args.only.split(",") if s] or [s[0] for s in STEPS]
    unknown = set(args.steps) - known
    if unknown:
        parser.error(f"unknown steps {sorted(unknown)}; steps: {', '.join(sorted(known))}")
    if args.messages is not None and args.messages < 1000:
        parser.error("--messages must be at least 1000")
    if args.update:
        missing = missing_steps(args.out, known)
        if missing:
            parser.error(
                f"--update measures steps again in a full run's results, and {args.out} lacks "
                f"{', '.join(missing)}: run the whole benchmark first (no --only)"
            )
    return args


def missing_steps(results_path: Path, steps: set[str]) -> list[str]:
    """The ``steps`` a results file was not measured with (all of them if it is missing, unreadable
    or older than the record of its steps): the base an ``--update`` would leave unmeasured."""
    try:
        recorded = json.loads(results_path.read_text()).get("steps")
    except (OSError, ValueError, AttributeError):
        recorded = None
    return sorted(steps - set(recorded)) if isinstance(recorded, list) else sorted(steps)


def context_note(load: Sequence[float], cores: int | None) -> str:
    if load and cores and load[0] >= 0.5 * cores:
        return (
            f"**The machine was busy:** the 1-minute load average was {load[0]} on {cores} cores when the "
            "run started (other processes shared the CPU), so absolute figures are noisy and low; the "
            "ratios to the peers, measured in the same run, are the more telling numbers."
        )
    return ""


def updated(base: dict[str, Any], new: dict[str, Any], steps: Sequence[str]) -> dict[str, Any]:
    """``base`` results with the workloads of ``new`` (a run of ``steps``) in place of those of the
    same ids, and the run recorded under ``updates`` (its date, steps, load and errors): a report of
    a full run with some steps measured again later, which says so. An earlier update keeps only the
    steps measured again by none after it (none left: it is dropped)."""
    fresh = {w["id"] for w in new["workloads"]}
    kept = [w for w in base["workloads"] if w["id"] not in fresh]
    earlier = [
        {**u, "steps": left}
        for u in base.get("updates", [])
        if (left := [s for s in u["steps"] if s not in steps])
    ]
    update = {
        "date": new["date"],
        "steps": list(steps),
        "load_average_start": new["machine"]["load_average_start"],
        "elapsed_s": new["elapsed_s"],
    }
    return {
        **base,
        "workloads": kept + new["workloads"],
        "updates": [*earlier, update],
        "errors": [*base.get("errors", []), *new["errors"]],
        "extra": {**base.get("extra", {}), **new.get("extra", {})},
    }


def _write_markdown(path: Path, text: str) -> None:
    """Write the report, keeping the soak section of the one it replaces."""
    old = path.read_text() if path.exists() else ""
    path.write_text(report.with_soak(text, report.soak_of(old)))


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render is not None:
        _write_markdown(args.markdown, report.render(json.loads(args.render.read_text())))
        print(f"wrote {args.markdown} from {args.render}")
        return 0
    sizes = Sizes.quick() if args.quick else Sizes()
    if args.messages is not None:
        sizes = dataclasses.replace(sizes, messages=args.messages)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    console = Console(width=None if sys.stdout.isatty() else 130)
    began = time.monotonic()
    host = machine.machine()
    host["load_after_steps"] = {}
    workloads: list[dict[str, Any]] = []
    errors: list[str] = []
    extra: dict[str, Any] = {}
    workdir = Path(tempfile.mkdtemp(prefix="lakemq-bench-", dir=args.workdir))
    redis_binary: str | None = None
    interrupted = False
    try:
        with RedisServer(workdir) as server:
            redis_binary = server.binary
            if args.no_redis:
                server.stop()
                server.why = "left out (--no-redis)"
            elif server.client is None:
                console.print(f"[yellow]Redis Streams peer not available: {server.why}")
            ctx = Context(sizes, workdir, server.client, server.why, lambda s: console.log(s))
            with Progress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                BarColumn(),
                TextColumn("{task.completed}/{task.total} steps"),
                TimeElapsedColumn(),
                console=console,
            ) as progress:
                overall = progress.add_task("benchmark", total=len(args.steps))
                for name, step, needs_store in STEPS:
                    if name not in args.steps:
                        continue
                    progress.update(overall, description=DESCRIPTIONS[name])
                    if needs_store and ctx.big_store is None:
                        errors.append(f"{name}: skipped, the big store was not built (run the produce step)")
                        progress.advance(overall)
                        continue
                    step_began = time.monotonic()
                    try:
                        workloads += step(ctx)
                    except Exception as exc:
                        errors.append(f"{name}: {type(exc).__name__}: {exc}")
                        console.print(f"[red]{name} failed:[/red]\n{traceback.format_exc()}")
                    console.log(f"{DESCRIPTIONS[name]}: {time.monotonic() - step_began:.0f} s")
                    host["load_after_steps"][name] = machine.load_average()[:1]
                    progress.advance(overall)
            extra = ctx.extra
    except KeyboardInterrupt:
        interrupted = True
        console.print("[red]interrupted: cleaning up")
    finally:
        if args.keep:
            console.print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    if interrupted:
        return 130
    host["load_average_end"] = machine.load_average()
    results: dict[str, Any] = {
        "command": os.environ.get("LAKEMQ_BENCH_COMMAND", "python bench/run.py")
        + (" --quick" if args.quick else "")
        + (f" --messages {args.messages}" if args.messages is not None else ""),
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "mode": "quick" if args.quick else "full",
        "steps": list(args.steps),
        "elapsed_s": round(time.monotonic() - began, 1),
        "machine": host,
        "versions": machine.versions(redis_binary),
        "params": dataclasses.asdict(sizes),
        "context_note": context_note(host["load_average_start"], host["cores"]),
        "workloads": workloads,
        "extra": extra,
        "errors": errors,
    }
    if args.update:
        results = updated(json.loads(args.out.read_text()), results, args.steps)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2, default=str) + "\n")
    _write_markdown(args.markdown, report.render(results))
    table = Table(title="performance targets")
    for column in ("target", "lakemq", "verdict"):
        table.add_column(column)
    for row in report.console_rows(results):
        table.add_row(*row)
    console.print(table)
    for error in errors:
        console.print(f"[red]error: {error}")
    console.print(f"wrote {args.markdown} and {args.out} in {results['elapsed_s']:.0f} s")
    return 1 if errors else 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip interpreter teardown: pyarrow/delta-rs threads can abort a clean exit
