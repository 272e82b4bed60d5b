r"""Drain throughput: outbox against the raw-SQL ceiling, side by side in one run.

200,000 events wait in a buffer (loaded with COPY); a no-op handler. The framework:
``outbox distribute`` and ``outbox work --burst --processes P`` (P worker processes forked
after one start-up), started together and timed from the first start to the last exit
(process start-up included; ``--separate-commands``: P ``outbox work`` commands instead, each
with its own start-up, results in a file of their own). The ceiling: P plain
psycopg processes looping { claim up to B rows with the locking CTE and UPDATE ... RETURNING;
delete the group by group_id }. Both are measured for every batch size B in ``--batch-sizes``
(default 1,000; the handler's batch size comes from ``BENCH_BATCH_SIZE``) and every P in
``--processes``; each row keeps the rate of every run and their medians.
With ``--archive``, both also archive every row as JSON before deleting it. ``--max-batches N``
sets the handler's claim jobs (default 64) and writes its results to a file of their own;
so does ``--raw-by-address``, which makes the raw loop claim in outbox's own form (rows updated
at the addresses the locking CTE locked) instead of the target's join by id.

``--typed`` drains the typed buffer instead (an Enum, JSON, a DateTime with time zone, a
Numeric and a String beside the buffer's own columns), with a handler that reads every value
of every event through ``batch.events`` (``--typed rows``: through ``batch.rows``) and builds
a bulk request's body from them; the raw loop returns all the same columns, typed by psycopg
alone, and reads them the same way from its tuples. What it measures: what applying the
columns' types and building model instances cost on the hottest path. Results of their own.
``--without-distribute`` starts no ``outbox distribute`` beside the workers: burst workers
distribute by themselves, and the outbox side is the ``outbox work --burst`` commands alone, as
the typed target names it (results of their own).

    python -m benchmarks.drain_throughput --events 200000 --batch-sizes 100,1000,5000 \
        --processes 1,2 --runs 3 [--archive]
    python -m benchmarks.drain_throughput --typed --events 200000 --batch-sizes 1000 \
        --processes 1,2 --runs 3 --separate-commands [--without-distribute]

``--batch-size N`` is the same option for a single size.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

from benchmarks._common import (
    CpuMeter,
    command_line,
    fresh_tables,
    libpq_url,
    machine,
    scratch_database,
    write,
)
from benchmarks.bench_app import Base
from outbox.handler import MAX_MAX_BATCHES
from outbox.worker import DEFAULT_CONCURRENCY

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MAX_BATCHES = 64  # the bench app's, unless BENCH_MAX_BATCHES says otherwise
OUTBOX = Path(sys.executable).parent / "outbox"
APP = "benchmarks.bench_app:app"


def prepare(url: str) -> None:
    """Fresh framework tables and buffers (the bench app's)."""
    fresh_tables(url, Base.metadata)


# The bench app's buffers: plain (two columns), typed (five types), and JSON (a document).
PLAIN, TYPED, JSON_BUFFER = "bench_events", "bench_typed_events", "bench_json_events"
CHANNELS = ("EMAIL", "SMS", "PUSH")  # the typed buffer's enum labels: the members' names


def typed_line(n: int) -> str:
    """Row ``n`` of the typed buffer, in COPY's text format."""
    payload = f'{{"page": "/products/{n % 5000}", "items": [{n % 7}, {n % 11}]}}'
    occurred = f"2026-01-02 03:{n // 60 % 60:02}:{n % 60:02}.{n % 1000:03}+00"
    return f"{CHANNELS[n % 3]}\t{payload}\t{occurred}\t{n % 100000 / 100:.2f}\taccount-{n % 5000}\n"


def json_line(n: int) -> str:
    """Row ``n`` of the JSON buffer, in COPY's text format: a document of some 150 bytes."""
    return (
        f'{{"page": "/products/{n % 5000}", "account": "account-{n % 5000}", '
        f'"kind": "page_view", "items": [{n % 7}, {n % 11}], "referrer": "/search?q={n % 97}"}}\n'
    )


def load(dsn: str, events: int, *, typed: bool = False, table: str | None = None) -> None:
    """COPY ``events`` rows into the buffer (``typed``: the typed one; ``table``: the buffer
    named), then VACUUM ANALYZE it."""
    table = table or (TYPED if typed else PLAIN)
    if table == TYPED:
        copy_into = f"COPY {TYPED} (channel, payload, occurred_at, amount, account) FROM STDIN"
        data = "".join(typed_line(n) for n in range(events))
    elif table == JSON_BUFFER:
        copy_into = f"COPY {JSON_BUFFER} (payload) FROM STDIN"
        data = "".join(json_line(n) for n in range(events))
    else:
        copy_into = f"COPY {PLAIN} (account_id, kind) FROM STDIN"
        data = "".join(f"{n % 5000}\tpage_view\n" for n in range(events))
    with psycopg.connect(dsn) as conn:
        with conn.cursor() as cursor, cursor.copy(copy_into) as copy:
            copy.write(data)
        conn.commit()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"VACUUM ANALYZE {table}")
        conn.execute("TRUNCATE outbox_jobs, outbox_archive")


def remaining(dsn: str, table: str = PLAIN) -> int:
    with psycopg.connect(dsn) as conn:
        return int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])  # type: ignore[index]


def run_framework(
    url: str,
    processes: int,
    concurrency: int,
    env: dict[str, str],
    *,
    separate: bool = False,
    distribute: bool = True,
) -> float:
    """Seconds for `outbox distribute` + `outbox work --burst --processes P` to drain.

    ``separate``: P `outbox work --burst` commands instead, each paying its own start-up.
    ``distribute``: False, the workers alone.

    They start together, as cron and a fleet would: a burst worker that finds nothing to do yet
    distributes by itself, so neither waits for the other's start-up.
    """
    base = [str(OUTBOX), "--app", APP, "--database-url", url, "--log-level", "warning"]
    started = time.perf_counter()
    work = [*base, "work", "--burst", "--concurrency", str(concurrency), "--no-listen"]
    commands = [work] * processes if separate else [[*work, "--processes", str(processes)]]
    if distribute:
        commands.insert(0, [*base, "distribute"])
    running = [
        subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
        for command in commands
    ]
    for process in running:
        if process.wait() != 0:
            raise RuntimeError("an outbox process failed")
    return time.perf_counter() - started


def run_raw(
    dsn: str,
    processes: int,
    batch_size: int,
    archive: bool,
    *,
    by_address: bool = False,
    typed: bool = False,
    json: bool = False,
) -> float:
    """Seconds for P raw psycopg loops to drain (``by_address``: claiming in outbox's form;
    ``typed``: the typed buffer)."""
    command = [sys.executable, "-m", "benchmarks._raw_drain", dsn, str(batch_size)]
    if archive:
        command.append("archive")
    if by_address:
        command.append("by-address")
    if typed:
        command.append("typed")
    if json:
        command.append("json")
    started = time.perf_counter()
    loops = [subprocess.Popen(command, cwd=ROOT) for _ in range(processes)]
    for loop in loops:
        if loop.wait() != 0:
            raise RuntimeError("a raw loop failed")
    return time.perf_counter() - started


class Timeline(threading.Thread):
    """Samples the buffer's unclaimed count every 20 ms from its own connection: seconds from
    its start to the first claim, and to the last (``--timeline``; the sampling costs the
    database a little, so rates are measured without it)."""

    def __init__(self, dsn: str, events: int, table: str = PLAIN) -> None:
        super().__init__(daemon=True)
        self.dsn, self.events, self.table = dsn, events, table
        self.started = time.perf_counter()
        self.first_claim: float | None = None
        self.all_claimed: float | None = None

    def run(self) -> None:
        query = f"SELECT count(*) FROM {self.table} WHERE group_id IS NULL"
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while True:
                (unclaimed,) = conn.execute(query).fetchone()  # type: ignore[misc]
                elapsed = time.perf_counter() - self.started
                if self.first_claim is None and unclaimed < self.events:
                    self.first_claim = round(elapsed, 2)
                if unclaimed == 0:
                    self.all_claimed = round(elapsed, 2)
                    return
                time.sleep(0.02)


def integers(option: str) -> list[int]:
    """A comma-separated option as positive integers.

    Parsed after argparse rather than as its ``type``, so that the stored command shows the
    option as it was written.
    """
    try:
        values = [int(part) for part in option.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {option!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"not a list of positive integers: {option!r}")
    return values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    # One option under two names: ``--batch-size 500`` is a sweep of one size.
    parser.add_argument(
        "--batch-sizes",
        "--batch-size",
        dest="batch_sizes",
        default="1000",
        help="comma-separated handler batch sizes",
    )
    parser.add_argument("--processes", default="1,2")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=DEFAULT_CONCURRENCY,
        help="threads per worker (default: outbox work's own)",
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--archive", action="store_true")
    parser.add_argument(
        "--max-batches",
        type=int,
        default=DEFAULT_MAX_BATCHES,
        help="the handler's claim jobs (another value writes results of its own)",
    )
    parser.add_argument(
        "--separate-commands",
        action="store_true",
        help="P `outbox work` commands instead of one with --processes P (results of their own)",
    )
    parser.add_argument(
        "--without-distribute",
        action="store_true",
        help="no `outbox distribute` beside the workers, which distribute by themselves "
        "(results of their own)",
    )
    parser.add_argument(
        "--raw-by-address",
        action="store_true",
        help="the raw loop claims in outbox's form, by address, not the target's join by id "
        "(results of their own)",
    )
    parser.add_argument(
        "--typed",
        nargs="?",
        const="events",
        choices=("events", "rows", "json"),
        help="drain the typed buffer, the handler reading batch.events (or, with `rows`, "
        "batch.rows; with `json`, the JSON buffer and its events) (results of their own)",
    )
    parser.add_argument(
        "--suffix",
        default="",
        metavar="TEXT",
        help="appended to the results file's name (e.g. `_10m` for a run at another scale)",
    )
    parser.add_argument(
        "--timeline",
        action="store_true",
        help="also sample when the first and the last claim landed (slows both a little)",
    )
    args = parser.parse_args()
    try:
        batch_sizes, process_counts = integers(args.batch_sizes), integers(args.processes)
    except argparse.ArgumentTypeError as error:
        parser.error(str(error))
    if not 1 <= args.max_batches <= MAX_MAX_BATCHES:
        parser.error(f"--max-batches must be 1..{MAX_MAX_BATCHES}, got {args.max_batches}")
    url = scratch_database("outbox_bench_drain")
    dsn = libpq_url(url)
    results: dict[str, Any] = {
        "benchmark": "drain_throughput",
        "command": command_line("benchmarks.drain_throughput", args),
        "machine": machine(),
        "events": args.events,
        "batch_sizes": batch_sizes,
        "archive": args.archive,
        "worker_threads": args.concurrency,
        "max_batches": args.max_batches,
        "separate_commands": args.separate_commands,
        # Whether `outbox distribute` ran beside the workers (started with them).
        "distribute": not args.without_distribute,
        "raw_claim": "by_address" if args.raw_by_address else "by_id",
        # The typed buffer and how its handler reads it (None: the plain buffer, no-op).
        "typed": args.typed,
        "runs": args.runs,
        "rows": [],
    }
    json = args.typed == "json"
    typed = args.typed is not None and not json
    table = JSON_BUFFER if json else TYPED if typed else PLAIN
    prepare(url)
    meter = CpuMeter(dsn)
    for batch_size in batch_sizes:
        # The bench app reads its handler's batch size from the environment at import, so
        # every outbox process of this size gets it there.
        env = {
            **os.environ,
            "BENCH_BATCH_SIZE": str(batch_size),
            "BENCH_ARCHIVE": "1" if args.archive else "0",
            "BENCH_MAX_BATCHES": str(args.max_batches),
            "BENCH_TYPED": args.typed or "",
        }
        for processes in process_counts:
            rates: dict[str, list[float]] = {"raw": [], "outbox": []}
            cpu: dict[str, list[tuple[float, float | None]]] = {"raw": [], "outbox": []}
            timelines: dict[str, list[tuple[float | None, float | None]]] = {
                "raw": [],
                "outbox": [],
            }
            for run in range(args.runs):
                for variant in ("raw", "outbox"):
                    load(dsn, args.events, table=table)
                    timeline = Timeline(dsn, args.events, table) if args.timeline else None
                    if timeline is not None:
                        timeline.start()
                    meter.start()
                    if variant == "raw":
                        seconds = run_raw(
                            dsn,
                            processes,
                            batch_size,
                            args.archive,
                            by_address=args.raw_by_address,
                            typed=typed,
                            json=json,
                        )
                    else:
                        seconds = run_framework(
                            url,
                            processes,
                            args.concurrency,
                            env,
                            separate=args.separate_commands,
                            distribute=not args.without_distribute,
                        )
                    cpu[variant].append(meter.stop())
                    left = remaining(dsn, table)
                    if left:
                        raise RuntimeError(f"{variant} left {left} events behind")
                    rates[variant].append(args.events / seconds)
                    print(f"B={batch_size} P={processes} run {run + 1} {variant}: "
                          f"{args.events / seconds:,.0f}/s", flush=True)  # fmt: skip
                    if timeline is not None:
                        timeline.join()
                        timelines[variant].append((timeline.first_claim, timeline.all_claimed))
                        print(f"  first claim after {timeline.first_claim} s, last after "
                              f"{timeline.all_claimed} s, exit after {seconds:.2f} s")  # fmt: skip
            raw, ours = statistics.median(rates["raw"]), statistics.median(rates["outbox"])
            row = {
                "batch_size": batch_size,
                "processes": processes,
                "raw_rates": [round(r) for r in rates["raw"]],
                "outbox_rates": [round(r) for r in rates["outbox"]],
                "raw_median": round(raw),
                "outbox_median": round(ours),
                "ratio": round(ours / raw, 3),
                # CPU seconds per run: the measured processes, and PostgreSQL's backends.
                "raw_cpu": [list(c) for c in cpu["raw"]],
                "outbox_cpu": [list(c) for c in cpu["outbox"]],
            }
            if args.timeline:
                row["timeline_first_and_last_claim_seconds"] = timelines
            results["rows"].append(row)
            print(row, flush=True)
    name = "drain_throughput"
    if args.typed is not None:
        name += {"events": "_typed", "rows": "_typed_rows", "json": "_json"}[args.typed]
    if args.archive:
        name += "_archive"
    if args.max_batches != DEFAULT_MAX_BATCHES:
        name += f"_max_batches_{args.max_batches}"
    if args.separate_commands:
        name += "_separate_commands"
    if args.without_distribute:
        name += "_without_distribute"
    if args.raw_by_address:
        name += "_raw_by_address"
    print(f"results in {write(name + args.suffix, results)}")


if __name__ == "__main__":
    main()
