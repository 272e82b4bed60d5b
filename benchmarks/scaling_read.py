"""The desired-workers read (:func:`outbox.ops.scaling.read_scaling`) with millions of events
waiting, on PostgreSQL: what a KEDA poll, a Prometheus scrape or a run-once caller pays.

The buffer holds ``--waiting-rows`` unclaimed events and, ahead of them, ``--groups`` claimed
groups of 100 with their batch jobs (a third leased, a third backing off, the rest due);
``outbox_throughput`` holds a week of minutes of the handler. The bench handler and a second,
empty one are read. Then ``--handled-rows`` of the oldest unclaimed events are deleted without
a vacuum, as a drain that autovacuum has not caught up with leaves them: the unclaimed index's
first entries are dead, and the read is timed again. Each figure is the p50, p95 and maximum of
``--reads`` reads in milliseconds: the whole call, from Python, one statement.

    python -m benchmarks.scaling_read --waiting-rows 10000000
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import psycopg
from sqlalchemy import event

from benchmarks._common import (
    command_line,
    drop_database,
    fresh_tables,
    libpq_url,
    machine,
    percentile,
    scratch_database,
    write,
)
from benchmarks.bench_app import Base, BenchEvent, TypedBenchEvent
from outbox import Outbox, Urgency
from outbox.ops.scaling import read_scaling

DATABASE = "outbox_bench_scaling_read"
TARGET_MS = 5.0
GROUP_ROWS = 100


def load(dsn: str, waiting_rows: int, groups: int) -> None:
    """Claimed groups first (the oldest ids), then the waiting rows; their jobs; a week of
    throughput minutes."""
    claimed = groups * GROUP_ROWS
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO bench_events (account_id, kind, group_id, created_at) "
            "SELECT n %% 5000, 'page_view', "
            "CASE WHEN n <= %s THEN "
            "('00000000-0000-0000-0001-' || lpad(to_hex((n - 1) / %s), 12, '0'))::uuid END, "
            "now() - make_interval(secs => (%s - n) / 1000.0) "
            "FROM generate_series(1, %s) AS n",
            (claimed, GROUP_ROWS, claimed + waiting_rows, claimed + waiting_rows),
        )
        conn.execute(
            "INSERT INTO outbox_jobs (kind, handler, group_id, priority, attempts, run_at, "
            "lease_owner, lease_token, lease_expires_at) "
            "SELECT 'batch', 'bench', "
            "('00000000-0000-0000-0001-' || lpad(to_hex(g), 12, '0'))::uuid, 20, g %% 3, "
            "CASE WHEN g %% 3 = 1 THEN now() + interval '1 minute' ELSE now() END, "
            "CASE WHEN g %% 3 = 2 THEN 'bench-worker' END, "
            "CASE WHEN g %% 3 = 2 THEN gen_random_uuid() END, "
            "CASE WHEN g %% 3 = 2 THEN now() + interval '1 hour' END "
            "FROM generate_series(0, %s - 1) AS g",
            (groups,),
        )
        conn.execute(
            "INSERT INTO outbox_throughput (handler, minute, succeeded, dead, failed, "
            "satisfied, tolerating, busy_seconds) "
            "SELECT h, date_trunc('minute', now()) - make_interval(mins => m), "
            "6000, 1, 0, 5900, 80, 14.0 "
            "FROM generate_series(0, 10079) AS m, unnest(ARRAY['bench', 'typed']) AS h"
        )
        conn.execute(
            "INSERT INTO outbox_workers (id, hostname, pid, concurrency) "
            "SELECT 'bench:' || w, 'bench', w, 8 FROM generate_series(1, 4) AS w"
        )
        for table in ("bench_events", "outbox_jobs", "outbox_throughput", "outbox_workers"):
            conn.execute(f"VACUUM ANALYZE {table}")


def delete_oldest_waiting(dsn: str, rows: int, groups: int) -> None:
    """Delete the ``rows`` oldest unclaimed events, no vacuum after: their index entries stay,
    dead, at the start of the unclaimed index."""
    first = groups * GROUP_ROWS + 1
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM bench_events WHERE id >= %s AND id < %s", (first, first + rows))


def time_reads(app: Outbox, reads: int) -> dict[str, Any]:
    """p50, p95 and max milliseconds of ``reads`` reads, after one warm-up; the statements one
    read runs; what the last read found."""
    statements = [0]

    def counted(*_: Any) -> None:
        statements[0] += 1

    found = read_scaling(app)
    event.listen(app.engine, "before_cursor_execute", counted)
    found = read_scaling(app)
    event.remove(app.engine, "before_cursor_execute", counted)
    samples = []
    for _ in range(reads):
        started = time.perf_counter()
        found = read_scaling(app)
        samples.append(1000 * (time.perf_counter() - started))
    return {
        "p50_ms": round(statistics.median(samples), 2),
        "p95_ms": round(percentile(samples, 0.95), 2),
        "max_ms": round(max(samples), 2),
        "statements_per_read": statements[0],
        "desired_workers": found.desired_workers,
        "runnable": found.runnable,
        "drain_seconds": found.drain_seconds,
        "apdex": [b.apdex for b in found.bands],
    }


def explain(dsn: str, app: Outbox, runs: int = 21) -> dict[str, Any]:
    """The read's plan with its timings (EXPLAIN ANALYZE, BUFFERS), and the median planning
    and execution milliseconds the server reports over ``runs`` of it."""
    captured: list[tuple[str, Any]] = []

    def capture(conn: Any, cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        captured.append((statement, parameters))

    event.listen(app.engine, "before_cursor_execute", capture)
    read_scaling(app)
    event.remove(app.engine, "before_cursor_execute", capture)
    statement, parameters = captured[-1]
    planning, execution = [], []
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(runs):
            rows = conn.execute("EXPLAIN (ANALYZE, BUFFERS) " + statement, parameters).fetchall()
            lines = [r[0] for r in rows]
            planning.append(float(lines[-2].split()[-2]))
            execution.append(float(lines[-1].split()[-2]))
    return {
        "planning_ms_p50": round(statistics.median(planning), 3),
        "execution_ms_p50": round(statistics.median(execution), 3),
        "plan": lines,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--waiting-rows", type=int, default=10_000_000)
    parser.add_argument("--groups", type=int, default=1000)
    parser.add_argument("--handled-rows", type=int, default=1_000_000)
    parser.add_argument("--reads", type=int, default=200)
    parser.add_argument("--keep", action="store_true", help="Keep the database afterwards.")
    args = parser.parse_args()
    url = scratch_database(DATABASE)
    try:
        fresh_tables(url, Base.metadata)
        started = time.monotonic()
        load(libpq_url(url), args.waiting_rows, args.groups)
        loaded = time.monotonic() - started
        app = Outbox(url)
        app.handler(BenchEvent, name="bench", batch_size=GROUP_ROWS, urgency=Urgency.HOUR)(
            lambda batch: None
        )
        app.handler(TypedBenchEvent, name="typed", urgency=Urgency.REALTIME)(lambda batch: None)
        vacuumed = time_reads(app, args.reads)
        vacuumed["server"] = explain(libpq_url(url), app)
        delete_oldest_waiting(libpq_url(url), args.handled_rows, args.groups)
        dead_entries = time_reads(app, args.reads)
        dead_entries["server"] = explain(libpq_url(url), app)
        app.engine.dispose()
        data = {
            "benchmark": "scaling_read",
            "command": command_line("benchmarks.scaling_read", args),
            "machine": machine(),
            "waiting_rows": args.waiting_rows,
            "claimed_groups": args.groups,
            "handled_rows_not_vacuumed": args.handled_rows,
            "load_seconds": round(loaded, 1),
            "target_ms": TARGET_MS,
            "vacuumed": vacuumed,
            "dead_index_entries": dead_entries,
        }
        path = write(f"scaling_read_{args.waiting_rows}", data)
        for name, figures in (("vacuumed", vacuumed), ("dead entries", dead_entries)):
            print(
                f"{name:14} p50 {figures['p50_ms']:6.2f} ms  p95 {figures['p95_ms']:6.2f} ms  "
                f"max {figures['max_ms']:6.2f} ms  statements {figures['statements_per_read']}  "
                f"desired {figures['desired_workers']}  runnable {figures['runnable']}  "
                f"server: planning {figures['server']['planning_ms_p50']} ms, "
                f"execution {figures['server']['execution_ms_p50']} ms"
            )
        print(f"written to {path}")
    finally:
        if not args.keep:
            drop_database(DATABASE)


if __name__ == "__main__":
    main()
