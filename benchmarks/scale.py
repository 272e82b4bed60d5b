"""Scale: the distributor's count and one claim at 10,000 and at 1,000,000 waiting rows.

Both should stay flat as the backlog grows: the count is capped (it stops at
``batch_size * min(max_batches, COUNTED_BATCHES)`` rows, as the distributor's does) and the
claim reads the first ``batch_size`` entries of the partial index on unclaimed rows. Claims
of 1,000 rows (the throughput benchmarks' batch) and of 100 are timed: most of a claim's time
is writing its rows, which grows with the batch, not with the backlog. The claim of 1,000 rows
is timed once more returning its rows, as the worker runs it, beside the raw loop's claim of
1,000 rows through plain psycopg (``benchmarks._raw_drain``), which returns its rows too: what
the same work costs the database without outbox. All of them take turns, repeat by repeat;
each figure is the median of ``--repeat`` timings, kept with their spread; the plans (EXPLAIN
ANALYZE) are stored with the results.

    python -m benchmarks.scale --sizes 10000,1000000 --repeat 21
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from typing import Any

import psycopg
from sqlalchemy import text, update

from benchmarks._common import command_line, libpq_url, machine, scratch_database, write
from benchmarks._raw_drain import CLAIM
from benchmarks.bench_app import BenchEvent, app
from benchmarks.drain_throughput import load, prepare
from outbox._db import postgresql, queries
from outbox._engine.distributor import COUNTED_BATCHES

BATCH_SIZE = 1000
MAX_BATCHES = 64


def timed(
    works: dict[str, Any], repeat: int, dsn: str
) -> tuple[dict[str, float], dict[str, list[float]]]:
    """Median milliseconds of ``repeat`` calls of each work, and their spread (lowest,
    highest), each call in its own rolled-back transaction. The works take turns, call by call,
    so that a slower spell of the machine weighs on all of them alike. Each work gets the
    application's connection and a plain psycopg one to ``dsn``, and uses one of them."""
    samples: dict[str, list[float]] = {name: [] for name in works}
    with app.engine.connect() as conn, psycopg.connect(dsn) as raw:
        for _ in range(repeat):
            for name, work in works.items():
                started = time.perf_counter()
                work(conn, raw)
                samples[name].append(1000 * (time.perf_counter() - started))
                conn.rollback()
                raw.rollback()
    medians = {name: round(statistics.median(values), 2) for name, values in samples.items()}
    spreads = {name: [round(min(v), 2), round(max(v), 2)] for name, v in samples.items()}
    return medians, spreads


def works(table: Any, cap: int) -> dict[str, Any]:
    """What is timed at each backlog, by result key: a callable of (the application's
    connection, a plain psycopg one) each."""

    def claim(limit: int) -> Any:
        return lambda conn, _: queries.claim_rows(conn, "postgresql", table, uuid.uuid4(), limit)

    returning = claim_statement(table).returning(*table.c)
    return {
        "count_ms": lambda conn, _: queries.count_unclaimed(conn, table, cap),
        "claim_ms": claim(BATCH_SIZE),
        "claim_100_ms": claim(100),
        "claim_returning_ms": lambda conn, _: conn.execute(returning).all(),
        "raw_claim_ms": lambda _, raw: raw.execute(CLAIM, (BATCH_SIZE, uuid.uuid4())).fetchall(),
    }


def claim_statement(table: Any) -> Any:
    """outbox's claim of ``BATCH_SIZE`` rows on the bench buffer (a plain table: by address)."""
    where = postgresql.claimable(table, BATCH_SIZE, by_address=True)
    return update(table).where(where).values(group_id=uuid.uuid4())


def plan(statement: Any) -> str:
    """EXPLAIN ANALYZE of a statement, rolled back."""
    with app.engine.connect() as conn:
        compiled = statement.compile(conn, compile_kwargs={"literal_binds": True})
        rows = conn.execute(text(f"EXPLAIN (ANALYZE, BUFFERS OFF) {compiled}")).scalars()
        conn.rollback()
        return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,1000000")
    parser.add_argument("--repeat", type=int, default=21)
    args = parser.parse_args()
    url = scratch_database("outbox_bench_scale")
    dsn = libpq_url(url)
    app.use_database(url)
    table = BenchEvent.__table__
    cap = BATCH_SIZE * min(MAX_BATCHES, COUNTED_BATCHES)
    results: dict[str, Any] = {
        "benchmark": "scale",
        "command": command_line("benchmarks.scale", args),
        "machine": machine(),
        "rows": [],
    }
    for size in (int(s) for s in args.sizes.split(",")):
        prepare(url)
        load(dsn, size)
        timings, spreads = timed(works(table, cap), args.repeat, dsn)
        claim_plan = plan(claim_statement(table))
        row = {
            "waiting_rows": size,
            "count_cap": cap,
            **timings,
            "spread_ms": spreads,
            "claim_plan": claim_plan,
        }
        results["rows"].append(row)
        print(f"{size:>9} rows: capped count {timings['count_ms']} ms, claim of {BATCH_SIZE}"
              f" {timings['claim_ms']} ms, of 100 {timings['claim_100_ms']} ms; returning its"
              f" rows {timings['claim_returning_ms']} ms, the raw loop's"
              f" {timings['raw_claim_ms']} ms", flush=True)  # fmt: skip
    first, last = results["rows"][0], results["rows"][-1]
    results["claim_growth"] = round(last["claim_ms"] / first["claim_ms"], 2)
    print(f"claim time grows {results['claim_growth']}x; results in {write('scale', results)}")


if __name__ == "__main__":
    main()
