"""Soak the whole broker: ``bash bench/soak.sh [--minutes 20]``.

Runs the broker jobs (``jobs/broker.py``: dispatch, index, schedule, retry, pull log, maintenance) as
their own Spark application, 4 producer processes sending synchronously at a steady rate, 2 pull
consumers (one group, queues split between them, offsets committed) and 2 simple consumers (another
group, receive + ack), all on one store, for ``--minutes``. Every window (30 s) it records per-process
memory (RSS; the broker's JVM counted with it), send / pull / receive p99, end-to-end latency, data
file counts and ``_delta_log`` sizes per table. At the end it stops the producers, lets the consumers
drain, accounts for every message sent (each group must have received each one) and judges every
series: a series grows when its last quarter's median exceeds its first quarter's by more than
``GROWTH`` (and an absolute floor, so a few kilobytes of noise are not growth).

Results: ``bench/results/soak.json`` (every window and sample) and the soak section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from deltalake import DeltaTable  # noqa: E402
from rich.console import Console  # noqa: E402

from bench import report, soak_workers  # noqa: E402
from bench.machine import process_tree  # noqa: E402
from bench.workloads.flow import Broker  # noqa: E402
from engine import Admin, Store  # noqa: E402

TOPIC = "Soak"
QUEUES = 8
JOBS = "dispatch,index,schedule,retry,pull_log,maintenance"
GROWTH = 1.5  # last quarter's median over the first quarter's
FLOORS = {"rss_mib": 64.0, "ms": 20.0, "files": 20.0, "log_mib": 1.0}
DRAIN_S = 120.0
QUIT_S = 60.0  # after the drain: how long consumers told to quit have to report
MAINTENANCE_INTERVAL_S = 300.0  # the broker's maintenance job: a pass every 5 minutes


def rss_mib(pid: int) -> float:
    """Resident memory of ``pid`` and all its descendants (the broker's JVM), in MiB."""
    total = 0
    for p in process_tree([pid]):
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


def _size(path: Path) -> int:
    """A file's size; 0 when it was deleted since it was listed (a log cleanup racing the sample)."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def table_sizes(store_path: Path) -> dict[str, dict[str, float]]:
    """Per table: live data files (the current snapshot's), data files on disk (live, plus removed
    ones vacuum has not deleted yet), ``_delta_log`` files and MiB."""
    out: dict[str, dict[str, float]] = {}
    for table in sorted(p for p in store_path.iterdir() if (p / "_delta_log").is_dir()):
        data = sum(1 for _ in table.rglob("*.parquet") if "_delta_log" not in _.parts)
        log = [p for p in (table / "_delta_log").iterdir() if p.is_file()]
        try:
            live: float | None = len(DeltaTable(str(table)).file_uris())
        except Exception:  # a commit landing while the log is read: counted in the next sample
            live = None
        out[table.name] = {
            "live_files": live,
            "data_files": data,
            "log_files": len(log),
            "log_mib": sum(_size(p) for p in log) / 2**20,
        }
    return out


def judge(values: Sequence[float], floor: float) -> dict[str, Any]:
    """First and last quarter medians of a series, and whether it grew."""
    vals = [v for v in values if v is not None]
    if len(vals) < 4:
        return {"first": None, "last": None, "grows": None}
    quarter = max(1, len(vals) // 4)
    first, last = statistics.median(vals[:quarter]), statistics.median(vals[-quarter:])
    grows = last > first * GROWTH and last - first > floor
    return {"first": first, "last": last, "max": max(vals), "grows": grows}


def stop_workers(procs: Mapping[str, Any], early_exits: dict[str, int | None]) -> None:
    """After the drain: kill the workers still running, and record in ``early_exits`` those that
    exited with an error meanwhile (a consumer that dies while draining loses what it received)."""
    for name, proc in procs.items():
        if proc.is_alive():
            proc.kill()
        elif proc.exitcode and name not in early_exits:
            early_exits[name] = proc.exitcode


class Soak:
    def __init__(self, args: argparse.Namespace, workdir: Path, console: Console) -> None:
        self.args, self.console = args, console
        self.store_path = workdir / "store"
        self.ctx = mp.get_context("spawn")
        self.out: Any = self.ctx.Queue()
        self.stop, self.drained, self.quit = self.ctx.Event(), self.ctx.Event(), self.ctx.Event()
        self.drain_cut = False  # the consumers were told to quit at the drain's deadline
        self.procs: dict[str, Any] = {}
        self.windows: list[dict[str, Any]] = []
        self.samples: list[dict[str, Any]] = []
        self.finals: list[dict[str, Any]] = []
        # workers that died before the soak ended, or failed while draining
        self.early_exits: dict[str, int | None] = {}

    def start_workers(self) -> None:
        a, w, s = self.args, self.args.window, str(self.store_path)
        for i in range(a.producers):
            args = (s, TOPIC, i, a.rate, a.body_bytes, w, self.stop, self.out)
            self.procs[f"p{i}"] = self.ctx.Process(target=soak_workers.producer, args=args)
        for i in range(a.pullers):
            mine = [q for q in range(QUEUES) if q % a.pullers == i]
            args = (s, TOPIC, i, mine, w, self.stop, self.drained, self.quit, self.out)
            self.procs[f"c{i}"] = self.ctx.Process(target=soak_workers.pull_consumer, args=args)
        for i in range(a.simple):
            args = (s, TOPIC, i, w, self.stop, self.drained, self.quit, self.out)
            self.procs[f"s{i}"] = self.ctx.Process(target=soak_workers.simple_consumer, args=args)
        for proc in self.procs.values():
            proc.start()

    def collect(self, until: float) -> None:
        while time.monotonic() < until:
            try:
                item = self.out.get(timeout=1.0)
            except queue.Empty:
                continue
            (self.finals if item.get("final") else self.windows).append(item)

    def sample(self, broker: Broker) -> dict[str, Any]:
        pids = {name: p.pid for name, p in self.procs.items() if p.is_alive()}
        if broker.proc is not None:
            pids["broker"] = broker.proc.pid
        row = {
            "t": time.time(),
            "rss_mib": {name: rss_mib(pid) for name, pid in pids.items()},
            "tables": table_sizes(self.store_path),
        }
        self.samples.append(row)
        return row

    def run(self) -> dict[str, Any]:
        Admin(Store.open(str(self.store_path))).create_topic(TOPIC, QUEUES)
        log = self.args.out.with_suffix(".broker.log")
        log.parent.mkdir(parents=True, exist_ok=True)
        with Broker(self.store_path, log, jobs=JOBS) as broker:
            self.start_workers()
            try:
                return self._soak(broker)
            except BaseException:
                # a broker that died (or an interrupt) ends the soak: its workers must not outlive it
                # and load the machine for whatever runs next
                self.stop.set()
                self.drained.set()
                self.quit.set()
                stop_workers(self.procs, self.early_exits)
                raise

    def _soak(self, broker: Broker) -> dict[str, Any]:
        a = self.args
        began = time.monotonic()
        end = began + a.minutes * 60
        while time.monotonic() < end:
            self.collect(min(end, time.monotonic() + a.window))
            broker.check()
            for name, proc in self.procs.items():
                if not proc.is_alive() and name not in self.early_exits:
                    self.early_exits[name] = proc.exitcode
                    self.console.print(f"[red]{name} exited with code {proc.exitcode}[/red]")
            row = self.sample(broker)
            sent = sum(w["count"] for w in self.windows if w["role"] == "producer")
            self.console.print(
                f"[{(time.monotonic() - began) / 60:5.1f} min] sent {sent:,}; broker "
                f"{row['rss_mib'].get('broker', 0):.0f} MiB; commit_log files "
                f"{row['tables'].get('commit_log', {}).get('data_files', 0):.0f}"
            )
        self.stop.set()
        self.collect(time.monotonic() + 10)  # the producers' finals
        self.drained.set()
        deadline = time.monotonic() + DRAIN_S
        while any(p.is_alive() for p in self.procs.values()) and time.monotonic() < deadline:
            self.collect(time.monotonic() + 2)
        if any(p.is_alive() for p in self.procs.values()):
            # Consumers still behind: they stop and report what they received (the rest is their
            # backlog, reported as not received), then the stragglers are killed.
            self.drain_cut = True
            self.quit.set()
            deadline = time.monotonic() + QUIT_S
            while any(p.is_alive() for p in self.procs.values()) and time.monotonic() < deadline:
                self.collect(time.monotonic() + 2)
        self.collect(time.monotonic() + 2)
        stop_workers(self.procs, self.early_exits)
        return self.results()

    def results(self) -> dict[str, Any]:
        warmup_s = warmup_minutes(int(os.environ["MQ_LOG_RETENTION_MINUTES"])) * 60.0
        return {
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "params": {
                **{k: v for k, v in vars(self.args).items() if k not in ("out", "markdown")},
                "log_retention_minutes": int(os.environ["MQ_LOG_RETENTION_MINUTES"]),
            },
            "windows": self.windows,
            "samples": self.samples,
            "accounting": account(self.finals),
            "early_exits": self.early_exits,
            "drain_cut": self.drain_cut,
            "warmup_minutes": warmup_s / 60,
            "verdicts": verdicts(self.windows, self.samples, warmup_s),
        }


def warmup_minutes(log_retention_minutes: int) -> float:
    """What a soak leaves out of its verdicts: the log retention, and one maintenance pass (whose
    checkpoint cleans up the log behind it) after it."""
    return log_retention_minutes + MAINTENANCE_INTERVAL_S / 60


def account(finals: list[dict[str, Any]]) -> dict[str, Any]:
    """Every sent sequence number received by each group? Lost and duplicated counts per group."""
    sent = {s for f in finals if f["role"] == "producer" for s in f["sent"]}
    failed = sum(f.get("failed", 0) for f in finals if f["role"] == "producer")
    out: dict[str, Any] = {"sent": len(sent), "failed_sends": failed}
    for role in ("pull", "simple"):
        got = [s for f in finals if f["role"] == role for s in f["received"]]
        out[role] = {
            "received": len(got),
            "lost": len(sent - set(got)),
            "duplicates": len(got) - len(set(got)),
            "finals": sum(1 for f in finals if f["role"] == role),
        }
    return out


def verdicts(
    windows: list[dict[str, Any]], samples: list[dict[str, Any]], warmup_s: float = 0.0
) -> dict[str, Any]:
    """Per series (a latency p99 per role, RSS per process, live files, log files and log size per
    table): judged on what was measured after ``warmup_s`` (a Delta log only reaches its bound
    once the log retention has passed and a checkpoint cleaned up behind it). Data files on disk
    are not judged: removed files stay until vacuum's window (24 h) has passed, longer than a soak."""
    out: dict[str, Any] = {}
    began = min((r["t"] for r in [*windows, *samples] if "t" in r), default=0.0)
    windows = [w for w in windows if w.get("t", began + warmup_s) >= began + warmup_s]
    samples = [s for s in samples if s.get("t", began + warmup_s) >= began + warmup_s]
    series: dict[str, list[float]] = defaultdict(list)
    by_t: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for w in windows:
        by_t[(w["role"], w["id"])].append(w)
    for (role, _ident), rows in sorted(by_t.items()):
        for metric in ("send_ms", "pull_ms", "receive_ms", "e2e_ms"):
            values = [r[metric]["p99"] for r in rows if r.get(metric)]
            if values:
                series[f"{role} {metric} p99"].extend(values)  # the role's processes pooled, in time order
    for name, values in series.items():
        out[name] = judge(values, FLOORS["ms"])
    procs = sorted({name for s in samples for name in s["rss_mib"]})
    for name in procs:
        out[f"rss {name} MiB"] = judge([s["rss_mib"].get(name) for s in samples], FLOORS["rss_mib"])
    tables = sorted({t for s in samples for t in s["tables"]})
    for table in tables:
        for key, floor in (("live_files", FLOORS["files"]), ("log_files", FLOORS["files"])):
            values = [s["tables"].get(table, {}).get(key) for s in samples]
            out[f"{table} {key}"] = judge(values, floor)
        log_mib = [s["tables"].get(table, {}).get("log_mib") for s in samples]
        out[f"{table} log_mib"] = judge(log_mib, FLOORS["log_mib"])
    return out


def markdown(results: dict[str, Any]) -> str:
    p, acc = results["params"], results["accounting"]
    rate = p["producers"] * p["rate"]
    missing = "not received (backlog)" if results.get("drain_cut") else "lost"
    lines = [
        f"Run on {results['date']}: {p['minutes']} min, {p['producers']} producers x {p['rate']:g} msg/s "
        f"(sync sends of {p['body_bytes']} B, {rate:g} msg/s in all), {p['pullers']} pull consumers, "
        f"{p['simple']} simple consumers, broker jobs `{JOBS}`; windows of {p['window']:g} s. A series "
        f"\"grows\" when its last quarter's median is over {GROWTH}x its first quarter's (and past a floor), "
        f"judged after a warm-up of {results['warmup_minutes']:g} min. "
        f"Delta log retention {p['log_retention_minutes']} min (so that the soak reaches the log's bound); "
        "messages are kept 72 h, so the commit log's data grows by design. Live files are the current "
        "snapshot's; removed files stay on disk for vacuum's 24 h window, so files on disk are shown, "
        "not judged: "
        + ", ".join(
            f"{t} {v:,.0f}"
            for t, v in sorted(
                (t, s.get("data_files", 0))
                for t, s in (results["samples"] or [{}])[-1].get("tables", {}).items()
            )
            if v
        )
        + ".",
        "",
        "Workers that died during the soak or its drain: "
        + (
            ", ".join(f"{n} (exit code {c})" for n, c in sorted(results.get("early_exits", {}).items()))
            or "none"
        )
        + ".",
        "",
        f"Accounting: {acc['sent']:,} sent ({acc['failed_sends']} failed sends); "
        + "; ".join(
            f"{role} group received {acc[role]['received']:,}, {missing} {acc[role]['lost']}, "
            f"duplicates {acc[role]['duplicates']}"
            for role in ("pull", "simple")
        )
        + "."
        + (
            f" The consumers had not drained their backlog {DRAIN_S:g} s after the producers stopped and "
            "were told to stop: what they had not received was still waiting in the store, not lost."
            if results.get("drain_cut")
            else ""
        ),
        "",
        "| series | first quarter (median) | last quarter (median) | max | grows |",
        "|---|---:|---:|---:|---|",
    ]
    for name, v in results["verdicts"].items():
        if v["first"] is None:
            continue
        cells = " | ".join(f"{v[k]:,.1f}" for k in ("first", "last", "max"))
        lines.append(f"| {name} | {cells} | {'**yes**' if v['grows'] else 'no'} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--window", type=float, default=30.0, help="seconds per measurement window")
    parser.add_argument("--producers", type=int, default=4)
    # 20 msg/s in all: what this 2-core machine carries with the broker's JVM and 8 workers on it
    # while the consumers keep up (at 100 msg/s asked, the 2026-11-25 run sent 35 msg/s and its
    # simple consumers fell 10 minutes behind).
    parser.add_argument("--rate", type=float, default=5.0, help="messages per second per producer")
    parser.add_argument("--body-bytes", type=int, default=1024)
    parser.add_argument("--pullers", type=int, default=2)
    parser.add_argument("--simple", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "soak.json")
    parser.add_argument("--markdown", type=Path, default=ROOT / "BENCHMARKS.md", help="report to update")
    args = parser.parse_args(argv)
    console = Console(stderr=True)
    # A log retention short enough that the soak sees _delta_log reach its bound (the broker and every
    # worker inherit it); the default, 7 days, bounds it far beyond any soak.
    os.environ.setdefault("MQ_LOG_RETENTION_MINUTES", str(max(2, round(args.minutes / 4))))
    with tempfile.TemporaryDirectory(prefix="lakemq-soak-", ignore_cleanup_errors=True) as tmp:
        results = Soak(args, Path(tmp), console).run()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1, default=str))
    text = markdown(results)
    if args.markdown is not None:
        old = args.markdown.read_text() if args.markdown.exists() else "# Benchmarks\n"
        args.markdown.write_text(report.with_soak(old, text))
    console.print(text)
    acc = results["accounting"]
    return 0 if all(acc[r]["lost"] == 0 for r in ("pull", "simple")) else 1


if __name__ == "__main__":
    sys.exit(main())
