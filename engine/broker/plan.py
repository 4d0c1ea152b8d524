"""The broker's pass plan: its jobs, in the one order both of its runners follow.

One pass of the broker is the steps of :data:`PLAN`, in order:

1. ``dispatch``: commit-log rows -> consume-queue entries (every other job reads the consume queue);
2. ``index``: the key index of what was sent;
3. ``schedule``: delayed and timer messages now due, re-put to their real topics;
4. ``retry``: NACKed messages re-put toward their retry topics, or to dead-letter queues;
5. ``dispatch`` and 6. ``index`` again, so that what schedule and retry re-put is pullable and found
   by key within the same pass;
7. ``pull_log``: each consumer's pull log from the action log;
8. ``transaction_check``: check back undecided transactional messages, roll back the abandoned;
9. ``maintenance``: retention, compaction, checkpoints and vacuum.

Its runners:

- the Spark broker app's ``--once`` (``jobs/broker.py --once``) runs the Spark job registered under
  each step's :attr:`Step.job`, to completion, in this order; the job registry lists the jobs in the
  order of their first step (the order a running broker app starts them, each as its own query);
- :class:`engine.broker.loop.BrokerLoop` (``mq serve`` without Spark) calls each step's engine
  function in process (:attr:`Step.make_pass`) and skips a step when none of its input tables
  (:attr:`Step.inputs`) has a version its job's last pass did not cover.

The loop's cadence (:attr:`Step.cadence`): the first dispatch runs on every tick (every 20 ms by
default: what bounds send-to-pullable latency); the steps up to the transaction check run with it
every round (every 500 ms); maintenance runs on its own, slower cadence (every
:data:`~engine.broker.maintenance.DEFAULT_INTERVAL_S`, the maintenance job's interval, first one
interval after the loop starts), on a thread of its own.

Why the loop runs ``pull_log`` and ``maintenance`` too: with them ``mq serve`` alone is a whole
broker, as the broker app is (message traces see the pulls of wire consumers; the one small file
every commit leaves is compacted, and old consumed messages expire). ``pull_log`` is skipped while
the action log has no new version, so it costs an idle round one probe. A maintenance pass is
seconds of I/O on a big store: on the loop's thread it would hold up dispatch, and pulls waiting for
new messages with it, hence its own cadence and thread. It runs beside the other steps as the
maintenance query runs beside the other queries of the broker app, which its commits are made for
(each commits exactly the next version with the table's markers carried and retries off).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Literal

from engine.broker.dispatch import dispatch_pending
from engine.broker.index import Indexer
from engine.broker.maintenance import maintain
from engine.broker.pull_log import build_pull_log
from engine.broker.retry import RetryRouter, route_retries
from engine.broker.schedule import Scheduler
from engine.broker.transactions import TransactionCheck
from engine.store import schemas
from engine.store.store import Store

Cadence = Literal["tick", "round", "slow"]
Pass = Callable[[], object]


def _commit_logs(store: Store) -> Sequence[str]:
    return store.commit_logs  # every shard: a commit on any of them is new work


def _action_log(store: Store) -> Sequence[str]:
    return (schemas.ACTION_LOG,)


def _no_inputs(store: Store) -> Sequence[str]:
    return ()  # the pass has work as time goes by (due deliveries, overdue halves, old files)


@dataclass(frozen=True)
class Step:
    """One step of the plan.

    Attributes:
        job: the job's name: the Spark job registered under it
            (:mod:`engine.spark.jobs.registry`), its status file and checkpoint.
        make_pass: ``make_pass(store)`` returns the step's pass without Spark, called once per run;
            an in-process runner makes it once per job and keeps it (schedule and retry keep state
            between passes).
        inputs: ``inputs(store)``: the tables whose new versions make the pass worth running; none
            (the default): every run.
        cadence: how often the in-process loop runs the step: ``"tick"`` every tick, ``"round"``
            every round of the other jobs, ``"slow"`` on its own slower cadence.
    """

    job: str
    make_pass: Callable[[Store], Pass]
    inputs: Callable[[Store], Sequence[str]] = _no_inputs
    cadence: Cadence = "round"


def _dispatch(store: Store) -> Pass:
    return partial(dispatch_pending, store)


def _index(store: Store) -> Pass:
    return Indexer(store)


def _schedule(store: Store) -> Pass:
    return Scheduler(store).deliver_due


def _retry(store: Store) -> Pass:
    return partial(route_retries, store, router=RetryRouter(store))


def _pull_log(store: Store) -> Pass:
    return partial(build_pull_log, store)


def _transaction_check(store: Store) -> Pass:
    return TransactionCheck(store)


def _maintenance(store: Store) -> Pass:
    return partial(maintain, store)


PLAN: tuple[Step, ...] = (
    Step("dispatch", _dispatch, _commit_logs, cadence="tick"),
    Step("index", _index, _commit_logs),
    Step("schedule", _schedule),
    Step("retry", _retry, _action_log),
    Step("dispatch", _dispatch, _commit_logs),  # what schedule and retry re-put becomes pullable
    Step("index", _index, _commit_logs),
    Step("pull_log", _pull_log, _action_log),
    Step("transaction_check", _transaction_check),
    Step("maintenance", _maintenance, cadence="slow"),
)


def plan_jobs(plan: Sequence[Step] = PLAN) -> tuple[str, ...]:
    """Every job of ``plan`` once, in the order of its first step."""
    return tuple(dict.fromkeys(step.job for step in plan))
