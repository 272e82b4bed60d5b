"""Scale: the distributor's count and one claim at 10,000 and at 1,000,000 waiting rows.

Both should stay flat as the backlog grows: the count is capped (it stops at
``batch_size * min(max_batches, COUNTED_BATCHES)`` rows, as the distributor's does) and the
claim reads the first ``batch_size`` entries of the partial index on unclaimed rows. Claims
of 1,000 rows (the throughput benchmarks' batch) and of 100 are timed: most of a claim's time
is writing its rows, which grows with the batch, not with the backlog. Beside them, the raw
loop's claim of 1,000 rows through plain psycopg (``benchmarks._raw_drain``): what the same
work costs the database without outbox. Each figure is the median of ``--repeat`` timings;
the plans (EXPLAIN ANALYZE) are stored with the results.

    python -m benchmarks.scale --sizes 10000,1000000 --repeat 21
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from typing import Any

from sqlalchemy import text

from benchmarks._common import command_line, libpq_url, machine, scratch_database, write
from benchmarks.bench_app import BenchEvent, app
from benchmarks.claim_contention import timed_claim
from benchmarks.drain_throughput import load, prepare
from outbox import _sql
from outbox.distributor import COUNTED_BATCHES

BATCH_SIZE = 1000
MAX_BATCHES = 64


def timed(work: Any, repeat: int) -> float:
    """Median milliseconds of ``repeat`` calls (each in its own rolled-back transaction)."""
    samples = []
    for _ in range(repeat):
        with app.engine.connect() as conn:
            started = time.perf_counter()
            work(conn)
            samples.append(1000 * (time.perf_counter() - started))
            conn.rollback()
    return round(statistics.median(samples), 2)


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
        count_ms = timed(lambda conn: _sql.count_unclaimed(conn, table, cap), args.repeat)
        claim_ms, claim_100_ms = (
            timed(
                lambda conn, n=n: _sql.claim_rows(conn, "postgresql", table, uuid.uuid4(), n),
                args.repeat,
            )
            for n in (BATCH_SIZE, 100)
        )
        raw_claim_ms = timed_claim(dsn, BATCH_SIZE, args.repeat)
        claim = _sql.claim_update("postgresql", table, uuid.uuid4(), BATCH_SIZE)
        row = {
            "waiting_rows": size,
            "count_cap": cap,
            "count_ms": count_ms,
            "claim_ms": claim_ms,
            "claim_100_ms": claim_100_ms,
            "raw_claim_ms": raw_claim_ms,
            "claim_plan": plan(claim),
        }
        results["rows"].append(row)
        print(f"{size:>9} rows: capped count {count_ms} ms, claim of {BATCH_SIZE} {claim_ms} ms,"
              f" of 100 {claim_100_ms} ms, raw claim of {BATCH_SIZE} {raw_claim_ms} ms",
              flush=True)  # fmt: skip
    first, last = results["rows"][0], results["rows"][-1]
    results["claim_growth"] = round(last["claim_ms"] / first["claim_ms"], 2)
    print(f"claim time grows {results['claim_growth']}x; results in {write('scale', results)}")


if __name__ == "__main__":
    main()
