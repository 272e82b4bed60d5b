"""Idle buffers: what distribution and a worker's idle loop cost per buffer that has nothing.

Two applications on one scratch database: one with 10 buffer tables and a handler each, all 10
with events waiting; one with ``--buffers`` tables (default 1,000), the same 10 busy and the
rest empty. For each, side by side in one run, taking turns tick by tick:

- ``distribute``: one distribution of every handler without a tick (``outbox distribute``, and
  the fleet leader's distribution in ``outbox work``);
- ``distribute_on_tick``: the same with a schedule's tick (``outbox distribute --every``, a
  Celery beat), a new tick each time;
- ``distribute_one_by_one`` and ``distribute_on_tick_one_by_one``: both as they were before
  the buffers with nothing waiting were found in one statement (a transaction per handler,
  and one per handler to take its tick), for comparison in the same run;
- ``acquire``: a worker's idle poll, leasing due jobs of every handler it serves (none due);
- ``flow_refresh``: a worker's read of its handlers' pauses and breakers (once a second);
- ``distribution_watch``: the leader's look for events nobody distributes (without
  ``distribute_every``, once per rescue interval).

Each is measured per call: wall and client CPU time, statements sent (``before_cursor_execute``)
and the PostgreSQL backends' CPU time (``/proc`` of the database's backends, when the server
runs on this machine). The claim jobs a distribution enqueues are deleted between calls, so
that every call finds the same work.

    python -m benchmarks.idle_buffers --buffers 1000 --busy 10 --ticks 8 --rounds 3
    python -m benchmarks.idle_buffers --ticks 3 --rounds 2 \
        --url mysql+pymysql://root@127.0.0.1:3306/idle_buffers_bench

``--url``: a database made for it beforehand (MariaDB's, for instance), whose tables it drops
and makes again, and leaves; without it, a PostgreSQL scratch database, dropped at the end.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, MetaData, create_engine, delete, event, insert, text
from sqlalchemy.orm import DeclarativeBase

from benchmarks._common import (
    command_line,
    drop_database,
    fresh_tables,
    machine,
    scratch_database,
    write,
)
from outbox import Batch, BufferMixin, Outbox, schema
from outbox._engine import acquisition, distributor
from outbox._engine.flow_state import FlowState
from outbox._services.distribution_watch import DistributionWatch

DATABASE = "idle_buffers_bench"
EVENTS_PER_BUSY_BUFFER = 250


class Base(DeclarativeBase):
    pass


def buffer_models(count: int) -> list[type[Any]]:
    """``count`` buffer models, made at run time: ``idle_buf_0000`` and on."""
    return [
        type(f"IdleBuf{i:04d}", (BufferMixin, Base), {"__tablename__": f"idle_buf_{i:04d}"})
        for i in range(count)
    ]


def noop(batch: Batch[Any]) -> None:
    """Accept every event."""


def make_app(url: str, models: list[type[Any]], prefix: str) -> Outbox:
    """An application with one handler per buffer model, named ``<prefix><number>``: the
    two applications' ticks are their own."""
    app = Outbox(url)
    for i, model in enumerate(models):
        app.handler(model, name=f"{prefix}{i:04d}", batch_size=100, max_batches=4)(noop)
    return app


class Meter:
    """Counts the statements an engine sends, and the CPU time of the database's backends."""

    def __init__(self, engine: Engine, database: str | None) -> None:
        self.statements = 0
        self._database = database
        self._admin = create_engine(engine.url) if database else None
        event.listen(engine, "before_cursor_execute", self._count)

    def _count(self, *args: Any) -> None:
        self.statements += 1

    def backend_cpu(self) -> float | None:
        """CPU seconds of every backend connected to the database (PostgreSQL on this host)."""
        if self._admin is None:
            return None
        with self._admin.connect() as conn:
            pids = conn.execute(
                text(
                    "SELECT pid FROM pg_stat_activity"
                    " WHERE datname = :d AND pid <> pg_backend_pid()"
                ),
                {"d": self._database},
            ).scalars()
            total = 0.0
            for pid in pids:
                try:
                    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                except OSError:
                    return None
                total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return total


def measure(
    meter: Meter, call: Callable[[], Any], calls: int, before: Callable[[], Any]
) -> dict[str, float | None]:
    """``calls`` calls in a row (``before`` each, not timed): the median call's wall and client
    CPU milliseconds and statements, and the backends' CPU milliseconds per call (their total
    over the block, ``before`` included: the clock ticks in hundredths of a second)."""
    walls, cpus, sent = [], [], []
    server_then = meter.backend_cpu()
    for _ in range(calls):
        before()
        statements = meter.statements
        wall, cpu = time.perf_counter(), time.process_time()
        call()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
        sent.append(meter.statements - statements)
    server_now = meter.backend_cpu()
    server = None if server_then is None or server_now is None else server_now - server_then
    return {
        "wall_ms": round(statistics.median(walls) * 1000, 3),
        "client_cpu_ms": round(statistics.median(cpus) * 1000, 3),
        "statements": statistics.median(sent),
        "server_cpu_ms": None if server is None else round(server * 1000 / calls, 2),
    }


def median(samples: list[dict[str, float | None]]) -> dict[str, float | None]:
    """Each figure's median over the rounds (None when unreadable)."""
    found: dict[str, float | None] = {}
    for key in samples[0]:
        values = [s[key] for s in samples if s[key] is not None]
        found[key] = round(statistics.median(values), 3) if values else None  # type: ignore[type-var]
    return found


def clear_jobs(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(delete(schema.jobs))


def scenarios(app: Outbox, tick: list[int]) -> dict[str, Callable[[], Any]]:
    """The calls measured, for one application."""
    names = list(app.handlers)
    flow = FlowState(app, refresh_every=1.0)
    watch = DistributionWatch(app, "bench")

    def on_tick() -> Any:
        tick[0] += 1
        return distributor.run_on_tick(app, tick[0])

    def one_by_one() -> Any:
        # What a distribution was before the empty buffers were found in one statement.
        return [distributor.distribute_handler(app, h) for h in app.handlers.values()]

    def on_tick_one_by_one() -> Any:
        tick[0] += 1
        return [
            distributor.distribute_handler(app, h)
            for h in app.handlers.values()
            if distributor.take_tick(app, h.name, tick[0])
        ]

    def acquire() -> Any:
        return acquisition.acquire(
            app,
            worker_id="bench",
            serving=names,
            handlers=names,
            cap=lambda name: None,
            probing=lambda name: False,
            limit=8,
        )

    return {
        "distribute": lambda: distributor.run_once(app),
        "distribute_on_tick": on_tick,
        "distribute_one_by_one": one_by_one,
        "distribute_on_tick_one_by_one": on_tick_one_by_one,
        "acquire": acquire,
        "flow_refresh": flow.refresh,
        "distribution_watch": lambda: watch.run_once(names),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--buffers", type=int, default=1000)
    parser.add_argument("--busy", type=int, default=10)
    parser.add_argument("--ticks", type=int, default=10, help="calls in a row, per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--url", default=None, help="a database of your own (default: scratch)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch database")
    args = parser.parse_args()

    url = args.url or scratch_database(DATABASE)
    models = buffer_models(args.buffers)
    metadata: MetaData = Base.metadata
    print(f"creating {args.buffers} buffer tables ...", flush=True)
    if url.startswith("mysql"):
        engine = create_engine(url)
        with engine.begin() as conn:
            conn.execute(text("SET FOREIGN_KEY_CHECKS=0"))
        engine.dispose()
    fresh_tables(url, metadata)
    small = make_app(url, models[: args.busy], "small_")
    large = make_app(url, models, "large_")
    with large.engine.begin() as conn:
        for model in models[: args.busy]:
            conn.execute(insert(model.__table__), [{}] * EVENTS_PER_BUSY_BUFFER)
    database = url.rsplit("/", 1)[1].split("?")[0] if url.startswith("postgresql") else None
    meters = {"small": Meter(small.engine, database), "large": Meter(large.engine, database)}
    ticks = [10_000_000, 10_000_000]
    calls = {"small": scenarios(small, ticks[:1]), "large": scenarios(large, ticks[1:])}
    # The large app's handlers get their outbox_handlers rows once, as in a running fleet.
    distributor.run_on_tick(large, 1)
    distributor.run_on_tick(small, 1)
    samples: dict[str, dict[str, list[dict[str, float | None]]]] = {
        size: {name: [] for name in calls[size]} for size in calls
    }
    for _ in range(args.rounds + 1):
        for name in calls["small"]:
            for size in ("small", "large"):
                samples[size][name].append(
                    measure(
                        meters[size],
                        calls[size][name],
                        args.ticks,
                        lambda: clear_jobs(large.engine),
                    )
                )
    results: dict[str, Any] = {}
    for name in calls["small"]:
        # The first round warms caches (compiled statements, the server's plans).
        small_figures = median(samples["small"][name][1:])
        large_figures = median(samples["large"][name][1:])
        ratio = {
            key: None
            if not small_figures[key] or large_figures[key] is None
            else round(large_figures[key] / small_figures[key], 2)  # type: ignore[operator]
            for key in small_figures
        }
        results[name] = {
            f"{args.busy}_buffers": small_figures,
            f"{args.buffers}_buffers": large_figures,
            "ratio": ratio,
        }
        print(f"{name:20} {args.busy:>5}: {small_figures}")
        print(f"{'':20} {args.buffers:>5}: {large_figures}  ratio {ratio}")
    for app in (small, large):
        app.engine.dispose()
    dialect = url.split("+")[0].split(":")[0]
    write(
        f"idle_buffers_{dialect}" if dialect != "postgresql" else "idle_buffers",
        {
            "benchmark": "idle_buffers",
            "command": command_line("benchmarks.idle_buffers", args),
            "machine": machine(),
            "database": dialect,
            "buffers": args.buffers,
            "busy": args.busy,
            "events_per_busy_buffer": EVENTS_PER_BUSY_BUFFER,
            "ticks": args.ticks,
            "rounds": args.rounds,
            "per_call_median": results,
        },
    )
    if args.url is None and not args.keep:
        drop_database(DATABASE)


if __name__ == "__main__":
    main()
