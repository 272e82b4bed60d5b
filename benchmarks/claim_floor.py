"""Claim floor: what stamping 1,000 rows costs PostgreSQL, with parts of the work taken away.

The scale benchmark times outbox's claim of 1,000 rows at 1,000,000 waiting rows, and the raw
loop's claim beside it. This one asks how fast any claim that stamps its rows could be on the
machine: the same claim (outbox's form, by address, nothing returned) on the same buffer, then
with one part of what it writes taken away at a time. Each variant's schema change is made in
the claim's own transaction and rolled back with it; only the claim statement is timed.

* ``outbox``: the buffer as outbox creates it (primary key, unclaimed index, group index);
* ``no_row_lock``: the UPDATE without ``FOR UPDATE SKIP LOCKED`` (no lock record per row;
  unsafe with concurrent claimers, so a floor, not an option);
* ``no_group_index``: without the group index (the batch job would have to find its rows
  another way);
* ``unclaimed_index_only``: without the group index and without the primary key;
* ``heap_only``: a copy of the buffer with fillfactor 50 whose only index is its primary key,
  so that the stamp is a heap-only update that writes no index entry at all (the pick reads
  the primary key and filters on ``group_id``). Created once, before the timings.

The variants take turns, repeat by repeat. Each variant's statement is also run once under
``EXPLAIN (ANALYZE, WAL)``: its WAL records and bytes are stored with the timings, and for
``heap_only`` the share of its updates that were heap-only (``pg_stat_user_tables``).

    python -m benchmarks.claim_floor --events 1000000 --repeat 21
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from typing import Any

import psycopg

from benchmarks._common import command_line, libpq_url, machine, scratch_database, write
from benchmarks.drain_throughput import load, prepare

BATCH_SIZE = 1000


def claim(table: str, *, lock: bool = True) -> str:
    """The claim of ``limit`` rows of ``table``, stamped ``group``, by address."""
    locking = " FOR UPDATE SKIP LOCKED" if lock else ""
    return (
        f"UPDATE {table} SET group_id = %(group)s WHERE ctid = ANY (ARRAY("
        f"SELECT ctid FROM {table} WHERE group_id IS NULL ORDER BY id LIMIT %(limit)s{locking}))"
    )


# name: (statements run first in the claim's transaction, untimed; the timed claim)
VARIANTS: dict[str, tuple[list[str], str]] = {
    "outbox": ([], claim("bench_events")),
    "no_row_lock": ([], claim("bench_events", lock=False)),
    "no_group_index": (["DROP INDEX ix_bench_events_group_id"], claim("bench_events")),
    "unclaimed_index_only": (
        [
            "DROP INDEX ix_bench_events_group_id",
            "ALTER TABLE bench_events DROP CONSTRAINT bench_events_pkey",
        ],
        claim("bench_events"),
    ),
    "heap_only": ([], claim("bench_events_heap_only")),
}

HEAP_ONLY_COPY = [
    "CREATE TABLE bench_events_heap_only (LIKE bench_events INCLUDING DEFAULTS)"
    " WITH (fillfactor = 50)",
    "INSERT INTO bench_events_heap_only SELECT * FROM bench_events ORDER BY id",
    "ALTER TABLE bench_events_heap_only ADD PRIMARY KEY (id)",
]


def run_claim(conn: psycopg.Connection[Any], variant: str, *, explain: bool = False) -> Any:
    """One claim of a variant in a transaction of its own, rolled back: its milliseconds, or
    with ``explain`` its plan's top node (EXPLAIN ANALYZE, WAL) as JSON."""
    setup, statement = VARIANTS[variant]
    for sql in setup:
        conn.execute(sql)  # type: ignore[arg-type]
    if explain:
        statement = f"EXPLAIN (ANALYZE, WAL, FORMAT JSON) {statement}"
    params = {"group": uuid.uuid4(), "limit": BATCH_SIZE}
    started = time.perf_counter()
    cursor = conn.execute(statement, params)  # type: ignore[arg-type]
    elapsed = 1000 * (time.perf_counter() - started)
    result = cursor.fetchone()[0][0]["Plan"] if explain else elapsed  # type: ignore[index]
    conn.rollback()
    return result


def heap_only_share(dsn: str) -> tuple[int, int]:
    """Updates, and heap-only ones, counted so far on the heap-only copy (aborted ones too).

    Read from a connection of its own, a moment after the timing connection closed: a backend
    publishes its counts when it exits."""
    time.sleep(1)
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables"
            " WHERE relname = 'bench_events_heap_only'"
        ).fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=21)
    args = parser.parse_args()
    if args.events < BATCH_SIZE or args.repeat < 1:
        parser.error(f"--events takes at least {BATCH_SIZE:,} and --repeat at least 1")
    url = scratch_database("outbox_bench_claim_floor")
    dsn = libpq_url(url)
    prepare(url)
    load(dsn, args.events)
    with psycopg.connect(dsn, autocommit=True) as conn:
        for sql in HEAP_ONLY_COPY:
            conn.execute(sql)  # type: ignore[arg-type]
        conn.execute("VACUUM ANALYZE bench_events_heap_only")
    samples: dict[str, list[float]] = {name: [] for name in VARIANTS}
    updated_before = heap_only_share(dsn)
    with psycopg.connect(dsn) as conn:
        for _ in range(args.repeat):
            for name in VARIANTS:
                samples[name].append(run_claim(conn, name))
    updated_after = heap_only_share(dsn)
    with psycopg.connect(dsn) as conn:
        plans = {name: run_claim(conn, name, explain=True) for name in VARIANTS}
    updates = updated_after[0] - updated_before[0]
    heap_only_updates = updated_after[1] - updated_before[1]
    rows = []
    for name in VARIANTS:
        plan = plans[name]
        row = {
            "variant": name,
            "claim_ms": round(statistics.median(samples[name]), 2),
            "spread_ms": [round(min(samples[name]), 2), round(max(samples[name]), 2)],
            "wal_records": plan.get("WAL Records"),
            "wal_bytes": plan.get("WAL Bytes"),
        }
        rows.append(row)
        print(row, flush=True)
    results = {
        "benchmark": "claim_floor",
        "command": command_line("benchmarks.claim_floor", args),
        "machine": machine(),
        "waiting_rows": args.events,
        "batch_size": BATCH_SIZE,
        "repeat": args.repeat,
        "rows": rows,
        "heap_only_updates": {"updates": updates, "heap_only": heap_only_updates},
    }
    print(f"heap-only copy: {heap_only_updates} of {updates} updates were heap-only")
    print(f"results in {write('claim_floor', results)}")


if __name__ == "__main__":
    main()
