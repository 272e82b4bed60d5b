"""Claim contention: what a claim pays for the rows concurrent claims of its buffer hold locked.

A claim's pick (``FOR UPDATE SKIP LOCKED``, oldest first) steps over every row another claim
has locked and not yet committed, at the head of the same index. With N claimers of one
handler running at once, each may step over the rows of N - 1 others. The claim of
``--batch-size`` rows is timed (median of ``--repeat``, each rolled back) while another
connection holds, uncommitted, a claim of each of ``--held`` rows.

    python -m benchmarks.claim_contention --held 0,1000,3000,7000,15000 --repeat 21
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from typing import Any

import psycopg

from benchmarks._common import command_line, libpq_url, machine, scratch_database, write
from benchmarks._raw_drain import CLAIM
from benchmarks.drain_throughput import load, prepare


def timed_claim(dsn: str, batch_size: int, repeat: int) -> float:
    """Median milliseconds of a claim of ``batch_size`` rows, each rolled back."""
    samples = []
    with psycopg.connect(dsn) as conn:
        for _ in range(repeat):
            started = time.perf_counter()
            conn.execute(CLAIM, (batch_size, uuid.uuid4())).fetchall()
            samples.append(1000 * (time.perf_counter() - started))
            conn.rollback()
    return round(statistics.median(samples), 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--held", default="0,1000,3000,7000,15000", help="rows held locked")
    parser.add_argument("--repeat", type=int, default=21)
    args = parser.parse_args()
    url = scratch_database("outbox_bench_contention")
    dsn = libpq_url(url)
    prepare(url)
    load(dsn, args.events)
    rows: list[dict[str, Any]] = []
    try:
        held_counts = sorted({int(n) for n in args.held.split(",")} | {0})
    except ValueError:
        parser.error(f"--held takes comma-separated row counts, got {args.held!r}")
    if held_counts[0] < 0:
        parser.error("--held takes row counts >= 0")
    for held in held_counts:
        with psycopg.connect(dsn) as holder:
            if held:
                holder.execute(CLAIM, (held, uuid.uuid4()))  # locked until rolled back
            claim_ms = timed_claim(dsn, args.batch_size, args.repeat)
            holder.rollback()
        rows.append({"held": held, "claim_ms": claim_ms})
        print(f"{held:>7,} rows held locked: claim of {args.batch_size:,} {claim_ms} ms")
    base = rows[0]["claim_ms"]
    per_row = [(r["claim_ms"] - base) * 1000 / r["held"] for r in rows if r["held"]]
    results = {
        "benchmark": "claim_contention",
        "command": command_line("benchmarks.claim_contention", args),
        "machine": machine(),
        "events": args.events,
        "batch_size": args.batch_size,
        "rows": rows,
        "microseconds_per_held_row": round(statistics.median(per_row), 2) if per_row else None,
    }
    print(f"about {results['microseconds_per_held_row']} µs per row held locked")
    print(f"results in {write('claim_contention', results)}")


if __name__ == "__main__":
    main()
