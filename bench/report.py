"""The design's performance targets and the Markdown report (BENCHMARKS.md): pure functions of the results.

``results`` is what ``bench/run.py`` writes to ``bench/results/latest.json``: ``machine``,
``versions``, ``params``, ``workloads`` (a list of ``{"id", "title", "kind", "systems", "notes"}``)
and a few run facts.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bench.stats import is_available, ratio
from bench.workloads import BARE, OURS, REDIS, ROCKETMQ, SYSTEMS

_OPS: dict[str, Callable[[float, float], bool]] = {">=": operator.ge, "<=": operator.le}


@dataclass(frozen=True)
class Condition:
    """``metric op threshold``; metric is a measure key (``msg_s``, ``p50_ms``, ``p99_ms``) or
    ``ratio:<system>`` (lakemq's headline number over that system's)."""

    metric: str
    op: str
    threshold: float

    def value(self, systems: Mapping[str, Mapping[str, Any]]) -> float | None:
        ours = systems.get(OURS)
        if ours is None or not is_available(ours):
            return None
        if self.metric.startswith("ratio:"):
            return ratio(ours, systems.get(self.metric.removeprefix("ratio:")))
        value = ours.get(self.metric)
        return None if value is None else float(value)


@dataclass(frozen=True)
class Target:
    """A performance target of the design on one workload: every condition must hold."""

    label: str
    workload: str
    conditions: tuple[Condition, ...]


def _pull_target(kind: str, phase: str) -> Target:
    where = "random offsets" if kind == "random" else "tail"
    return Target(
        f"pull 32 from a 1M-message store ({where}, {phase} compaction): p50 <= 10 ms, p99 <= 50 ms",
        f"pull_{kind}_{phase}",
        (Condition("p50_ms", "<=", 10), Condition("p99_ms", "<=", 50)),
    )


TARGETS: tuple[Target, ...] = (
    Target("batched produce, 1 KiB: >= 150k msg/s", "produce_batched", (Condition("msg_s", ">=", 150_000),)),
    Target(
        "batched produce: >= 50 % of bare write_deltalake",
        "produce_batched",
        (Condition(f"ratio:{BARE}", ">=", 0.5),),
    ),
    Target("single synchronous send: p50 <= 30 ms", "send_sync", (Condition("p50_ms", "<=", 30),)),
    Target("async producer with linger: >= 20k msg/s", "send_async", (Condition("msg_s", ">=", 20_000),)),
    _pull_target("random", "before"),
    _pull_target("tail", "before"),
    _pull_target("random", "after"),
    _pull_target("tail", "after"),
    Target(
        "end to end through the running dispatch job: p50 <= 1 s, p99 <= 3 s",
        "end_to_end",
        (Condition("p50_ms", "<=", 1000), Condition("p99_ms", "<=", 3000)),
    ),
    Target("delayed delivery lateness: p99 <= 1.5 s", "delay_lateness", (Condition("p99_ms", "<=", 1500),)),
    Target("Spark batch replay: >= 1M msg/s", "replay", (Condition("msg_s", ">=", 1_000_000),)),
    Target(
        "Spark batch replay: >= 70 % of a native Delta scan",
        "replay",
        (Condition(f"ratio:{BARE}", ">=", 0.7),),
    ),
    Target(
        "topic-filtered SELECT over messages: within 1.5x of the bare Delta table",
        "select_topic",
        (Condition(f"ratio:{BARE}", ">=", 1 / 1.5),),
    ),
    Target(
        "df.write.format('mq'), 4 partitions: >= 60 % of the batched producer",
        "spark_sink",
        (Condition(f"ratio:{BARE}", ">=", 0.6),),
    ),
    Target(
        "per-message ack, 4 processes, batches of 32: >= 25 % of Redis XREADGROUP + XACK",
        "ack_4proc",
        (Condition(f"ratio:{REDIS}", ">=", 0.25),),
    ),
    Target(
        "receive(max_nums=1) + ack, one consumer: >= 500 msg/s",
        "ack_single",
        (Condition("msg_s", ">=", 500),),
    ),
    Target(
        "creating a topic: within 3x one synchronous send", "topic_create", (Condition("x_send", "<=", 3),)
    ),
    Target(
        "synchronous send with 10,000 topics: within 1.5x of one topic",
        "send_many_topics",
        (Condition("x_one_topic", "<=", 1.5),),
    ),
    Target(
        "commit metadata with 300 topics x 4 queues in use: <= 4 KiB",
        "commit_metadata",
        (Condition("commit_bytes", "<=", 4096),),
    ),
    Target(
        "synchronous send with SYNC_FLUSH: within 2x of ASYNC_FLUSH",
        "send_sync_flush",
        (Condition("x_async_flush", "<=", 2),),
    ),
    Target(
        "8 writers without the host lock: 4 shards >= 2.5x one shard",
        "contention_shards",
        (Condition("x_one_shard", ">=", 2.5), Condition("gave_up", "<=", 0)),
    ),
    Target(
        "8 writers without the host lock, one shard: none gives up",
        "contention_racing",
        (Condition("gave_up", "<=", 0),),
    ),
)


def fmt_ms(value: float) -> str:
    """Milliseconds with the precision that matters at their size."""
    if value < 10:
        return f"{value:.2f} ms"
    if value < 100:
        return f"{value:.1f} ms"
    return f"{value:,.0f} ms"


def fmt_value(metric: str, value: float) -> str:
    if metric.startswith("x_"):
        return f"{value:.2f}x {metric.removeprefix('x_').replace('_', ' ')}"
    if metric == "gave_up":
        return f"{value:,.0f} gave up"
    if metric.endswith("_bytes"):
        return f"{value:,.0f} B"
    if metric.startswith("ratio:"):
        return f"{value:.0%} of {metric.removeprefix('ratio:')}"
    if metric.endswith("_ms"):
        return f"{metric.removesuffix('_ms')} {fmt_ms(value)}"
    return f"{value:,.0f} msg/s"


def evaluate(target: Target, workloads: Mapping[str, Mapping[str, Any]]) -> tuple[str, bool | None]:
    """What was measured for a target, and whether it is met (None: not measured)."""
    workload = workloads.get(target.workload)
    if workload is None:
        return "not measured", None
    systems = workload["systems"]
    parts, met = [], True
    for condition in target.conditions:
        value = condition.value(systems)
        if value is None:
            return "not measured", None
        parts.append(fmt_value(condition.metric, value))
        met = met and _OPS[condition.op](value, condition.threshold)
    missing = systems.get(OURS, {}).get("missing")
    if missing:
        parts.append(f"{missing} messages never seen")
        met = False
    return ", ".join(parts), met


def verdict(met: bool | None) -> str:
    return {True: "MET", False: "NOT MET", None: "not measured"}[met]


def _ratio_cell(workload: Mapping[str, Any], peer: str) -> str:
    systems = workload["systems"]
    value = ratio(systems.get(OURS, {}), systems.get(peer))
    if value is None:
        return "—"
    if workload["kind"] == "rate":
        return f"{value:.0%}"
    return times(value)


def times(value: float) -> str:
    """A latency ratio (ours / peer) in words: ``3.2x slower``, ``14x faster``."""
    if value <= 0:
        return "—"
    factor, word = (value, "slower") if value >= 1 else (1 / value, "faster")
    if factor < 2:
        return f"{factor:.2f}x {word}"
    return f"{factor:.1f}x {word}" if factor < 10 else f"{factor:,.0f}x {word}"


def _cell(measure: Mapping[str, Any] | None, key: str) -> str:
    if measure is None:
        return "—"
    if not is_available(measure):
        return "n/a"
    value = measure.get(key)
    if value is None:
        return "—"
    if key.endswith("_ms"):
        return fmt_ms(float(value))
    if key == "msg_s":
        return f"{value:,.0f}"
    if key == "seconds":
        return f"{value:.2f}"
    return f"{value:,}"


def workload_table(workload: Mapping[str, Any]) -> list[str]:
    """One workload as a Markdown table: a row per system, with lakemq's ratio to each peer."""
    systems = workload["systems"]
    keys: tuple[str, ...]
    if workload["kind"] == "rate":
        head = "| system | msg/s | messages | seconds | lakemq vs this |"
        keys = ("msg_s", "n", "seconds")
        sep = "|---|---:|---:|---:|---:|"
    else:
        head = "| system | median (p50) | p99 | mean | samples | lakemq (median) vs this |"
        keys = ("p50_ms", "p99_ms", "mean_ms", "n")
        sep = "|---|---:|---:|---:|---:|---:|"
    lines = [head, sep]
    for name in SYSTEMS:
        measure = systems.get(name)
        if measure is None:
            continue
        cells = [_cell(measure, k) for k in keys]
        if not is_available(measure):
            cells = [f"not available: {measure['unavailable']}", *["" for _ in keys[1:]]]
        elif measure.get("missing"):
            cells[-1] += f" ({measure['missing']} never seen)"
        ratio_cell = "—" if name == OURS else _ratio_cell(workload, name)
        lines.append(f"| {name} | {' | '.join(cells)} | {ratio_cell} |")
    return lines


def _measured_cell(workload: Mapping[str, Any], system: str) -> str:
    measure = workload["systems"].get(system)
    if measure is None or not is_available(measure):
        return "n/a" if measure is None else f"not available: {measure['unavailable']}"
    if workload["kind"] == "rate":
        return f"{measure['msg_s']:,} msg/s"
    return f"p50 {fmt_ms(float(measure['p50_ms']))}, p99 {fmt_ms(float(measure['p99_ms']))}"


def rocketmq_section(results: Mapping[str, Any]) -> list[str]:
    """lakemq's ``mq serve`` beside the real RocketMQ broker, both driven by RocketMQ's Java client
    (the workloads with a RocketMQ column); empty when the run had none."""
    compared = [w for w in results["workloads"] if ROCKETMQ in w["systems"]]
    if not compared:
        return []
    version = results.get("extra", {}).get("rocketmq_broker", "")
    out = [
        "## lakemq vs the real RocketMQ broker",
        "",
        "The same unmodified Apache RocketMQ Java client drives lakemq's `mq serve` and the real RocketMQ "
        f"name server and broker{f' {version}' if version else ''} (fetched from Maven, started and stopped "
        "by the run).",
        "",
        "| workload | lakemq (mq serve) | RocketMQ | lakemq vs RocketMQ |",
        "|---|---:|---:|---:|",
    ]
    for workload in compared:
        ours, theirs = _measured_cell(workload, OURS), _measured_cell(workload, ROCKETMQ)
        out.append(f"| {workload['title']} | {ours} | {theirs} | {_ratio_cell(workload, ROCKETMQ)} |")
    return [*out, ""]


def _how_ratios_read() -> str:
    return (
        "Ratios: for a throughput, lakemq's msg/s as a share of the peer's (100 % = as fast); for a latency, "
        "how many times slower or faster lakemq's median is than the peer's."
    )


def render(results: Mapping[str, Any]) -> str:
    """BENCHMARKS.md."""
    by_id = {w["id"]: w for w in results["workloads"]}
    machine, versions = results["machine"], results["versions"]
    evaluated = [(t, *evaluate(t, by_id)) for t in TARGETS]
    met = [t for t, _, ok in evaluated if ok]
    missed = [t for t, _, ok in evaluated if ok is False]
    unmeasured = [t for t, _, ok in evaluated if ok is None]
    out = [
        "# Benchmarks",
        "",
        f"Generated by `{results['command']}` on {results['date']} ({results['mode']} run, "
        f"{results['elapsed_s']:.0f} s). lakemq is measured side by side with its peers in the same "
        "run: bare delta-rs (the same Arrow data written and scanned with `deltalake`/`pyarrow` alone, the "
        "floor of our own overhead), Redis Streams (a real broker on loopback, persistence off) and, through "
        "RocketMQ's own Java client, the real RocketMQ broker. "
        "Targets are the design's performance targets; they are never asserted by tests. Raw figures: "
        "`bench/results/latest.json`.",
        "",
        "## Machine and versions",
        "",
        "| | |",
        "|---|---|",
        f"| CPU | {machine['cpu_model']}, {machine['cores']} cores |",
        f"| RAM | {machine['ram_gib']} GiB |",
        f"| OS | {machine['platform']} |",
        f"| load average (1/5/15 min) at start | {' / '.join(map(str, machine['load_average_start']))} |",
        f"| load average at end | {' / '.join(map(str, machine.get('load_average_end', [])))} |",
    ]
    steps = {k: v for k, v in machine.get("load_after_steps", {}).items() if v}
    if steps:
        text = ", ".join(f"{step} {values[0]}" for step, values in steps.items())
        out.append(f"| 1-min load average after each step | {text} |")
    out += [f"| {name} | {value} |" for name, value in versions.items()]
    out += [""]
    if results.get("context_note"):
        out += [results["context_note"], ""]
    out += [
        "## Targets",
        "",
        f"**{len(met)} of {len(TARGETS)} targets met.**"
        + (f" Not met: {'; '.join(t.label for t in missed)}." if missed else "")
        + (f" Not measured: {'; '.join(t.label for t in unmeasured)}." if unmeasured else ""),
        "",
        "| target | lakemq measured | vs bare delta-rs | vs Redis Streams | verdict |",
        "|---|---|---:|---:|---|",
    ]
    for target, measured, ok in evaluated:
        workload = by_id.get(target.workload)
        bare = _ratio_cell(workload, BARE) if workload else "—"
        red = _ratio_cell(workload, REDIS) if workload else "—"
        out.append(f"| {target.label} | {measured} | {bare} | {red} | **{verdict(ok)}** |")
    out += ["", _how_ratios_read(), "", *rocketmq_section(results), "## Workloads", ""]
    for workload in results["workloads"]:
        out += [f"### {workload['title']}", "", *workload_table(workload), ""]
        out += [f"- {note}" for note in workload.get("notes", ())]
        out += [""]
    params: Mapping[str, Any] = results.get("params", {})
    if params:
        out += ["## Sizes of this run", "", "| | |", "|---|---|"]
        out += [f"| {k} | {v} |" for k, v in params.items()]
        out += [""]
    return "\n".join(out)


def console_rows(results: Mapping[str, Any]) -> Sequence[tuple[str, str, str]]:
    """(target, measured, verdict) for the summary printed at the end of a run."""
    by_id = {w["id"]: w for w in results["workloads"]}
    return [(t.label, m, verdict(ok)) for t, m, ok in ((t, *evaluate(t, by_id)) for t in TARGETS)]


SOAK_START, SOAK_END = "<!-- soak: written by bench/soak.py -->", "<!-- /soak -->"
SOAK_TITLE = "## Soak of the whole broker"


def soak_of(markdown: str) -> str | None:
    """The body of the soak section of ``markdown``, if it has one."""
    start, end = markdown.find(SOAK_START), markdown.find(SOAK_END)
    if not 0 <= start < end:
        return None
    return markdown[start + len(SOAK_START) : end].replace(SOAK_TITLE, "", 1).strip() or None


def with_soak(markdown: str, soak: str | None) -> str:
    """``markdown`` without its soak section, then ``soak`` as that section (when given).

    The soak (``bash bench/soak.sh``) runs apart from ``bench/run.sh`` (it takes 20 minutes): a
    benchmark run keeps the last soak's section, and a soak replaces only its own.
    """
    start, end = markdown.find(SOAK_START), markdown.find(SOAK_END)
    if 0 <= start < end:
        markdown = markdown[:start] + markdown[end + len(SOAK_END) :]
    body = markdown.rstrip("\n")
    if not soak:
        return body + "\n"
    return f"{body}\n\n{SOAK_START}\n{SOAK_TITLE}\n\n{soak.strip()}\n{SOAK_END}\n"
