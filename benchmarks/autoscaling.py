"""An autoscaler that follows desired workers against one that follows the row count, through
a load step, on per-slot rates measured by real drains on PostgreSQL.

First each handler of the scenario is drained for real: ``--measure-events`` events by one
burst worker of one slot, its handler sleeping ``latency`` seconds a batch as a downstream
would; events handled per second is that handler's rate of one slot. Then a model replays the
scenario second by second against those rates: events arrive, the ready workers' slots take
them most urgent band first (a fleet-wide rate limit caps its handler), each event's wait is
kept, and what was handled is counted per handler and minute as ``outbox_throughput`` counts
it. An autoscaler polls as KEDA does (every ``--poll`` seconds), sets the replicas, and the
HPA under it keeps the highest recommendation of the last ``--stabilization`` seconds before
scaling down; a new worker is ready ``--startup`` seconds after it is asked for, and costs
from then.

- *desired workers*: replicas = ceil(``desired_workers`` / slots per worker), where
  ``desired_workers`` is :func:`outbox.ops.scaling.plan`'s, fed what ``read_scaling`` would read
  from the model's state (the backlog as a run of ids, the newest and oldest ages, the slots in
  flight counted at an instant, the minutes counted with their busy seconds) - KEDA's
  metrics-api scaler on ``GET /api/v1/scaling``;
- *row count*: replicas = ceil(rows waiting / T) - KEDA's postgresql scaler on
  ``count(*)``, given its best ``T``: the largest of a doubling series that keeps every
  promise in every scenario.

The scenarios: a REALTIME handler whose arrivals step from ``--base-rate`` to each of
``--step-rates`` events a second for ``--step-seconds``, alone; and the step to
``--step-rate`` while an HOUR handler behind a fleet-wide rate limit (``--limit-calls`` calls a
second) receives a backfill of ``--backfill`` events at once, and while the same handler
without a limit receives ``--big-backfill``. Each figure is the
worker-seconds spent (starting workers included), the highest wait over each handler's
promise (above 1: broken), each handler's Apdex, and the most workers at once.

    python -m benchmarks.autoscaling
"""

from __future__ import annotations

import argparse
import math
import random
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session

from benchmarks._common import fresh_tables
from benchmarks.bench_app import Base, BenchEvent, TypedBenchEvent
from outbox import Outbox, RateLimit, Urgency, add_events
from outbox._db.types import ScalingRow
from outbox.handler import Handler
from outbox.ops.scaling import DEFAULT_RATE_WINDOW_SECONDS, plan
from outbox.worker import Worker

TOLERATED = 4.0
SEED = 31


@dataclass
class Flow:
    """One handler in the model: its registration, its measured rate of one slot (events a
    second), and its arrivals (events a second at each second)."""

    handler: Handler[Any]
    rate: float
    arrivals: Callable[[int], float]
    queue: deque[list[float]] = field(default_factory=deque)
    """Cohorts waiting, oldest first: [second written, events]."""
    minutes: dict[int, float] = field(default_factory=dict)
    """Events handled in each minute."""
    busy: dict[int, float] = field(default_factory=dict)
    """Slot-seconds spent in each minute."""
    written: float = 0.0
    """Events written so far: the highest id."""
    slots: float = 0.0
    """Slots it held in the last second."""
    max_wait: float = 0.0
    handled: float = 0.0
    satisfied: float = 0.0
    tolerating: float = 0.0

    @property
    def waiting(self) -> float:
        return sum(count for _, count in self.queue)

    def limit_rate(self) -> float | None:
        """Events a second its fleet-wide rate limits let through; None without one."""
        rates = []
        for limit in self.handler.rate_limits:
            if limit.key is not None:
                continue
            for window in limit.windows():
                if window.exact:
                    per = self.handler.batch_size if window.unit.value == "calls" else 1
                    rates.append(window.capacity * per / window.period)
        return min(rates) if rates else None


@dataclass(frozen=True)
class Fleet:
    """How workers come and go: slots each, seconds to start, KEDA's poll, the HPA's window."""

    concurrency: int = 4
    startup: int = 20
    poll: int = 15
    stabilization: int = 300
    max_workers: int = 100


@dataclass(frozen=True)
class Outcome:
    """What one policy did over the scenario."""

    policy: str
    worker_seconds: float
    peak_workers: int
    staleness: dict[str, float]
    """Each handler's highest wait over its promise (above 1: the promise broken)."""
    apdex: dict[str, float]

    @property
    def kept(self) -> bool:
        return all(value <= 1.0 for value in self.staleness.values())


def simulate(
    flows: Sequence[Flow],
    policy: Callable[[int, Sequence[Flow], int], int],
    fleet: Fleet,
    seconds: int,
    name: str,
) -> Outcome:
    """Run the scenario second by second under ``policy`` (second, flows, ready slots ->
    workers wanted); fresh state each time."""
    for flow in flows:
        flow.queue.clear()
        flow.minutes.clear()
        flow.busy.clear()
        flow.slots = flow.max_wait = flow.handled = flow.satisfied = flow.tolerating = 0.0
        flow.written = 0.0
    ordered = sorted(flows, key=lambda f: f.handler.urgency.priority)
    workers: list[int] = []  # the second each one is ready
    asked: deque[tuple[int, int]] = deque()
    worker_seconds = 0.0
    peak = 0
    for now in range(seconds):
        for flow in flows:
            arriving = flow.arrivals(now)
            if arriving > 0:
                flow.queue.append([float(now), arriving])
                flow.written += arriving
        if now % fleet.poll == 0:
            ready_slots = sum(1 for w in workers if w <= now) * fleet.concurrency
            wanted = min(max(policy(now, flows, ready_slots), 0), fleet.max_workers)
            asked.append((now, wanted))
            while asked and asked[0][0] < now - fleet.stabilization:
                asked.popleft()
            target = wanted if wanted >= len(workers) else max(w for _, w in asked)
            if target > len(workers):
                workers += [now + fleet.startup] * (target - len(workers))
            elif target < len(workers):
                workers.sort()  # the last asked for (not ready yet) go first
                del workers[target:]
        worker_seconds += len(workers)
        peak = max(peak, len(workers))
        free = float(sum(1 for w in workers if w <= now) * fleet.concurrency)
        for flow in ordered:
            can = flow.waiting / flow.rate
            limited = flow.limit_rate()
            if limited is not None:
                can = min(can, limited / flow.rate)
            cap = flow.handler.concurrency
            if cap is not None:
                can = min(can, float(cap))
            flow.slots = min(can, free)
            free -= flow.slots
            if flow.slots > 0:
                flow.busy[now // 60] = flow.busy.get(now // 60, 0.0) + flow.slots
            _serve(flow, flow.slots * flow.rate, now + 1)
    return Outcome(
        policy=name,
        worker_seconds=worker_seconds,
        peak_workers=peak,
        staleness={f.handler.name: round(f.max_wait / f.handler.urgency.promise, 3) for f in flows},
        apdex={
            f.handler.name: round((f.satisfied + f.tolerating / 2) / f.handled, 4)
            if f.handled
            else 1.0
            for f in flows
        },
    )


def _serve(flow: Flow, events: float, done: int) -> None:
    """Hand ``events`` of the oldest waiting to the handler, finished at second ``done``."""
    promise = flow.handler.urgency.promise
    minute = (done - 1) // 60
    while events > 1e-9 and flow.queue:
        written, count = flow.queue[0]
        taken = min(count, events)
        wait = done - written
        flow.max_wait = max(flow.max_wait, wait)
        flow.handled += taken
        if wait <= promise:
            flow.satisfied += taken
        elif wait <= promise * TOLERATED:
            flow.tolerating += taken
        flow.minutes[minute] = flow.minutes.get(minute, 0.0) + taken
        events -= taken
        if taken >= count - 1e-9:
            flow.queue.popleft()
        else:
            flow.queue[0][1] = count - taken


def scaling_row(
    flow: Flow, now: int, slots: int, rate_window: float, sample: random.Random
) -> ScalingRow:
    """What ``read_scaling`` would read of the flow at second ``now``: its waiting events as
    the run of ids up to the events written so far, the ages of the newest and oldest, the
    slots holding its jobs, and its counted minutes in the rate window (each covering 60 s,
    this one as far as it went) with the slot-seconds spent in them. The slots holding its
    jobs are counted at an instant, as the read counts leases: a whole number whose mean is
    the slots it held (``sample`` rounds)."""
    waiting = round(flow.waiting)
    newest = now - flow.queue[-1][0] if flow.queue else None
    oldest = now - flow.queue[0][0] if flow.queue else None
    handled = covered = busy = 0.0
    for minute, count in sorted(flow.minutes.items()):
        start = minute * 60
        if start >= now - rate_window and count > 0:
            handled += count
            covered += min(60.0, max(1.0, float(now - start)))
            busy += flow.busy.get(minute, 0.0)
    last = round(flow.written)
    first = last - waiting + 1
    return ScalingRow(
        handler=flow.handler.name,
        first_unclaimed=first if waiting else None,
        last_unclaimed=last if waiting else None,
        newest_unclaimed_age=float(newest) if waiting and newest is not None else None,
        first_id=first if waiting else None,
        last_id=last if waiting else None,
        oldest_age=float(oldest) if waiting and oldest is not None else None,
        runnable_groups=0,
        live_leases=math.floor(flow.slots) + (sample.random() < flow.slots % 1),
        paused=False,
        recent_handled=round(handled),
        recent_seconds=covered,
        recent_busy=busy,
        busy_handled=round(handled),
        handled=0,
        satisfied=0,
        tolerating=0,
        fleet_slots=slots,
    )


def desired_policy(
    fleet: Fleet, target: float = 0.5, rate_window: float = DEFAULT_RATE_WINDOW_SECONDS
) -> Callable[[int, Sequence[Flow], int], int]:
    """KEDA's metrics-api scaler on ``desired_workers``, its target the slots of a worker."""
    sample = random.Random(SEED)

    def policy(now: int, flows: Sequence[Flow], slots: int) -> int:
        rows = [scaling_row(f, now, slots, rate_window, sample) for f in flows]
        found = plan([f.handler for f in flows], rows, target=target, rate_window=rate_window)
        return found.workers_for(fleet.concurrency)

    return policy


def rows_policy(rows_per_worker: int) -> Callable[[int, Sequence[Flow], int], int]:
    """KEDA's postgresql scaler on the rows waiting, ``rows_per_worker`` its target value."""

    def policy(now: int, flows: Sequence[Flow], slots: int) -> int:
        return math.ceil(sum(f.waiting for f in flows) / rows_per_worker)

    return policy


def best_rows_target(
    scenarios: Sequence[Sequence[Flow]], fleet: Fleet, seconds: int, start: int = 100
) -> int:
    """The largest row-count target of a doubling series (from ``start``) that keeps every
    promise in every scenario: the best an operator can set knowing all of them."""
    best = None
    target = start
    while target <= 100_000_000:
        kept = all(
            simulate(flows, rows_policy(target), fleet, seconds, "row count").kept
            for flows in scenarios
        )
        if not kept:
            break
        best = target
        target *= 2
    if best is None:
        raise RuntimeError(f"no row-count target from {start} keeps every promise")
    return best


def compare(
    scenarios: dict[str, Sequence[Flow]], fleet: Fleet, seconds: int
) -> tuple[int, dict[str, tuple[Outcome, Outcome]]]:
    """Each scenario under desired workers and under the row count at its best target (the
    target, and per scenario both outcomes)."""
    target = best_rows_target(list(scenarios.values()), fleet, seconds)
    return target, {
        name: (
            simulate(flows, desired_policy(fleet), fleet, seconds, "desired workers"),
            simulate(flows, rows_policy(target), fleet, seconds, f"row count, T={target}"),
        )
        for name, flows in scenarios.items()
    }


def measure_rate(url: str, latency: float, batch_size: int, events: int) -> float:
    """Events a second one slot handles, by a real drain: one burst worker of one slot, its
    handler sleeping ``latency`` seconds a batch."""
    fresh_tables(url, Base.metadata)
    app = Outbox(url)

    @app.handler(BenchEvent, batch_size=batch_size, name="measured")
    def measured(batch: Any) -> None:
        time.sleep(latency)

    rows = [{"account_id": n, "kind": "page_view"} for n in range(events)]
    with Session(app.engine) as session:
        add_events(session, BenchEvent, rows)
        session.commit()
    started = time.perf_counter()
    Worker(app, concurrency=1, burst=True).run()
    elapsed = time.perf_counter() - started
    app.engine.dispose()
    return events / elapsed


def scenario_flows(
    rates: tuple[float, float],
    *,
    base_rate: float,
    step_rate: float,
    step_at: int,
    step_seconds: int,
    backfill: int,
    backfill_at: int,
    limit_calls: int | None,
    batch_size: int,
    bands: tuple[Urgency, Urgency] = (Urgency.REALTIME, Urgency.HOUR),
) -> list[Flow]:
    """A handler whose arrivals step up and down, and one given a backfill, rate-limited to
    ``limit_calls`` calls a second unless None (the application is never connected to: its
    handlers' registrations are what the model reads)."""
    app = Outbox("sqlite://")
    alerts = app.handler(BenchEvent, batch_size=batch_size, urgency=bands[0], name="alerts")(
        lambda batch: None
    )
    sync = app.handler(
        TypedBenchEvent,
        batch_size=batch_size,
        urgency=bands[1],
        name="crm_sync",
        rate_limit=None if limit_calls is None else RateLimit(calls=limit_calls),
    )(lambda batch: None)
    _ = (alerts, sync)

    def stepping(now: int) -> float:
        return step_rate if step_at <= now < step_at + step_seconds else base_rate

    def backfilled(now: int) -> float:
        return float(backfill) if now == backfill_at else 0.0

    return [
        Flow(app.get_handler("alerts"), rates[0], stepping),
        Flow(app.get_handler("crm_sync"), rates[1], backfilled),
    ]


def main() -> None:
    from benchmarks._common import command_line, drop_database, machine, scratch_database, write

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--latency", type=float, default=0.2, help="Seconds a batch takes.")
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--measure-events", type=int, default=3000)
    parser.add_argument("--base-rate", type=float, default=200.0)
    parser.add_argument(
        "--step-rates", default="1500,3000,6000", help="The steps, each a scenario alone."
    )
    parser.add_argument("--step-rate", type=float, default=3000.0, help="The step with backfill.")
    parser.add_argument("--step-at", type=int, default=600)
    parser.add_argument("--step-seconds", type=int, default=1200)
    parser.add_argument("--backfill", type=int, default=600_000)
    parser.add_argument("--backfill-at", type=int, default=300)
    parser.add_argument("--limit-calls", type=int, default=5, help="crm_sync's calls a second.")
    parser.add_argument(
        "--big-backfill", type=int, default=6_000_000, help="A backfill without a rate limit."
    )
    parser.add_argument("--seconds", type=int, default=7200)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--startup", type=int, default=20)
    parser.add_argument("--poll", type=int, default=15)
    parser.add_argument("--stabilization", type=int, default=300)
    args = parser.parse_args()
    url = scratch_database("outbox_bench_autoscaling")
    try:
        rate = measure_rate(url, args.latency, args.batch_size, args.measure_events)
    finally:
        drop_database("outbox_bench_autoscaling")
    fleet = Fleet(args.concurrency, args.startup, args.poll, args.stabilization)
    shape = {
        "base_rate": args.base_rate,
        "step_at": args.step_at,
        "step_seconds": args.step_seconds,
        "backfill_at": args.backfill_at,
        "batch_size": args.batch_size,
    }
    scenarios = {
        f"step to {float(step):g}/s": scenario_flows(
            (rate, rate), step_rate=float(step), backfill=0, limit_calls=args.limit_calls, **shape
        )
        for step in args.step_rates.split(",")
    }
    scenarios[f"step to {args.step_rate:g}/s, rate-limited backfill {args.backfill:,}"] = (
        scenario_flows(
            (rate, rate),
            step_rate=args.step_rate,
            backfill=args.backfill,
            limit_calls=args.limit_calls,
            **shape,
        )
    )
    scenarios[f"step to {args.step_rate:g}/s, backfill {args.big_backfill:,}"] = scenario_flows(
        (rate, rate),
        step_rate=args.step_rate,
        backfill=args.big_backfill,
        limit_calls=None,
        **shape,
    )
    target, outcomes = compare(scenarios, fleet, args.seconds)
    data = {
        "benchmark": "autoscaling",
        "command": command_line("benchmarks.autoscaling", args),
        "machine": machine(),
        "rate_per_slot": round(rate, 1),
        "rows_per_worker": target,
        "scenarios": {
            name: {
                "policies": [
                    {
                        "policy": o.policy,
                        "worker_seconds": round(o.worker_seconds),
                        "peak_workers": o.peak_workers,
                        "promises_kept": o.kept,
                        "staleness": o.staleness,
                        "apdex": o.apdex,
                    }
                    for o in pair
                ],
                "worker_seconds_ratio": round(pair[0].worker_seconds / pair[1].worker_seconds, 3),
            }
            for name, pair in outcomes.items()
        },
    }
    path = write("autoscaling", data)
    print(f"one slot: {rate:.0f} events/s (measured by a real drain); row target {target}")
    for name, pair in outcomes.items():
        for o in pair:
            print(
                f"{name:36} {o.policy:22} worker-seconds {o.worker_seconds:7.0f}  "
                f"peak {o.peak_workers:3}  kept {o.kept}  staleness {o.staleness}"
            )
    print(f"written to {path}")


if __name__ == "__main__":
    main()
