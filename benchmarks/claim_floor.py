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

Then what the heap-only form costs elsewhere: without ``group_id`` in any index, its pick and
the distributor's capped count read every claimed row still in the heap. The claim and the
capped count are timed on both schemas with nothing in flight, and on a copy of each with
``--in-flight`` groups claimed (committed) at the buffer's head, all four tables vacuumed:
groups that workers are handling, or that wait for a retry while the receiving service is
down. The eight timings take turns, repeat by repeat.

    python -m benchmarks.claim_floor --events 1000000 --repeat 21 --in-flight 64
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
from outbox._engine.distributor import COUNTED_BATCHES

BATCH_SIZE = 1000
# The distributor's count stops here (benchmarks.scale counts the same way).
COUNT_CAP = BATCH_SIZE * COUNTED_BATCHES


def claim(table: str, *, lock: bool = True) -> str:
    """The claim of ``limit`` rows of ``table``, stamped ``group``, by address."""
    locking = " FOR UPDATE SKIP LOCKED" if lock else ""
    return (
        f"UPDATE {table} SET group_id = %(group)s WHERE ctid = ANY (ARRAY("
        f"SELECT ctid FROM {table} WHERE group_id IS NULL ORDER BY id LIMIT %(limit)s{locking}))"
    )


def capped_count(table: str) -> str:
    """The distributor's capped count of unclaimed rows, as outbox runs it."""
    return (
        f"SELECT count(*) FROM (SELECT 1 FROM {table} WHERE group_id IS NULL"
        f" ORDER BY id LIMIT {COUNT_CAP}) AS capped"
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

HEAP_ONLY_STORAGE = " WITH (fillfactor = 50)"

# schema: (its table, the storage parameters a copy of it needs)
IN_FLIGHT_SCHEMAS = {
    "outbox": ("bench_events", ""),
    "heap_only": ("bench_events_heap_only", HEAP_ONLY_STORAGE),
}
# The name of a table's copy with groups in flight: the table's and this.
IN_FLIGHT = "_in_flight"

HEAP_ONLY_COPY = [
    "CREATE TABLE bench_events_heap_only (LIKE bench_events INCLUDING DEFAULTS)"
    + HEAP_ONLY_STORAGE,
    "INSERT INTO bench_events_heap_only SELECT * FROM bench_events ORDER BY id",
    "ALTER TABLE bench_events_heap_only ADD PRIMARY KEY (id)",
]


def run_claim(conn: psycopg.Connection[Any], variant: str, *, explain: bool = False) -> Any:
    """One claim of a variant in a transaction of its own, rolled back: its milliseconds, or
    with ``explain`` its plan's top node (EXPLAIN ANALYZE, WAL) as JSON."""
    setup, statement = VARIANTS[variant]
    return run(conn, statement, setup, claim_params(), explain=explain)


def claim_params() -> dict[str, Any]:
    """A claim's parameters: a new group, ``BATCH_SIZE`` rows."""
    return {"group": uuid.uuid4(), "limit": BATCH_SIZE}


def run(
    conn: psycopg.Connection[Any],
    statement: str,
    setup: list[str] | None = None,
    params: dict[str, Any] | None = None,
    *,
    explain: bool = False,
) -> Any:
    """``statement`` after ``setup`` in a transaction of its own, rolled back: the statement's
    milliseconds, or with ``explain`` its plan's top node (EXPLAIN ANALYZE, WAL) as JSON."""
    for sql in setup or []:
        conn.execute(sql)  # type: ignore[arg-type]
    if explain:
        statement = f"EXPLAIN (ANALYZE, WAL, FORMAT JSON) {statement}"
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


def in_flight_copies(dsn: str, groups: int) -> None:
    """A copy of each schema's table with ``groups`` groups of ``BATCH_SIZE`` rows claimed at
    its head, committed, as workers hold them; then all of them vacuumed, so that only the
    in-flight rows themselves stand in the way."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for table, storage in IN_FLIGHT_SCHEMAS.values():
            copy = f"{table}{IN_FLIGHT}"
            for sql in (
                f"CREATE TABLE {copy} (LIKE {table} INCLUDING ALL){storage}",
                f"INSERT INTO {copy} SELECT * FROM {table} ORDER BY id",
            ):
                conn.execute(sql)  # type: ignore[arg-type]
            for _ in range(groups):
                conn.execute(claim(copy), claim_params())  # type: ignore[arg-type]
            for vacuumed in (table, copy):
                conn.execute(f"VACUUM ANALYZE {vacuumed}")  # type: ignore[arg-type]


def schema_costs(dsn: str, repeat: int) -> list[dict[str, Any]]:
    """Milliseconds of the claim and of the capped count on each schema of
    ``IN_FLIGHT_SCHEMAS``, with nothing in flight and on its in-flight copy: the median and the
    spread (lowest, highest) of each. All eight take turns, repeat by repeat, so that the
    machine's slower and faster spells weigh on them alike."""
    tables = {
        (schema, when): f"{table}{suffix}"
        for schema, (table, _) in IN_FLIGHT_SCHEMAS.items()
        for when, suffix in (("idle", ""), ("in_flight", IN_FLIGHT))
    }
    samples: dict[tuple[str, str, str], list[float]] = {}
    with psycopg.connect(dsn) as conn:
        for _ in range(repeat):
            for (schema, when), table in tables.items():
                for work, statement, params in (
                    ("claim_ms", claim(table), claim_params()),
                    ("count_ms", capped_count(table), None),
                ):
                    elapsed = run(conn, statement, params=params)
                    samples.setdefault((schema, when, work), []).append(elapsed)
    costs: dict[str, dict[str, dict[str, Any]]] = {}
    for (schema, when, work), values in samples.items():
        costs.setdefault(schema, {}).setdefault(when, {})[work] = {
            "median": round(statistics.median(values), 2),
            "spread": [round(min(values), 2), round(max(values), 2)],
        }
    return [{"schema": schema, **by_when} for schema, by_when in costs.items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=21)
    parser.add_argument("--in-flight", type=int, default=64, help="groups in flight")
    args = parser.parse_args()
    if args.events < BATCH_SIZE or args.repeat < 1 or args.in_flight < 1:
        parser.error(f"--events takes at least {BATCH_SIZE:,}, --repeat and --in-flight at least 1")
    if (args.in_flight + 1) * BATCH_SIZE > args.events:
        parser.error(f"--events must leave a claim of {BATCH_SIZE:,} rows past --in-flight")
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
    in_flight_copies(dsn, args.in_flight)
    in_flight = schema_costs(dsn, args.repeat)
    for row in in_flight:
        print(row, flush=True)
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
        "in_flight": {
            "groups": args.in_flight,
            "rows": args.in_flight * BATCH_SIZE,
            "count_cap": COUNT_CAP,
            "costs": in_flight,
        },
    }
    print(f"heap-only copy: {heap_only_updates} of {updates} updates were heap-only")
    print(f"results in {write('claim_floor', results)}")


if __name__ == "__main__":
    main()
