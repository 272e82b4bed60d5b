"""Drain throughput on MariaDB: outbox against a raw PyMySQL loop, side by side in one run.

200,000 events wait in the bench app's buffer (a no-op handler), on the MariaDB server at
``--url`` (default: this machine's). The framework: ``outbox distribute`` and P separate
``outbox work --burst`` commands, started together and timed from the first start to the last
exit. The raw loop, in P processes (``python -m benchmarks.drain_mariadb --raw URL B``): at READ
COMMITTED, { select up to B ids of unclaimed rows ``FOR UPDATE SKIP LOCKED``, stamp them with a
group id, read the group's rows back; delete the group }, the claim MariaDB allows (no
``UPDATE ... RETURNING``, no ``LIMIT`` inside ``IN``). Rates are medians of ``--runs``; the CPU
of the measured processes and of the server process (``mariadbd``, read from ``/proc``) is kept.

    python -m benchmarks.drain_mariadb --events 200000 --batch-size 1000 --processes 1,2 --runs 3

A figure shown beside its raw loop, not judged against a target.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pymysql
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from benchmarks._common import command_line, fresh_tables, machine, write
from benchmarks.bench_app import Base
from benchmarks.drain_throughput import ROOT, integers, run_framework
from outbox.worker import DEFAULT_CONCURRENCY

DEFAULT_URL = "mysql+pymysql://root@127.0.0.1:3306/test"
DATABASE = "outbox_bench_drain"
LOAD_CHUNK = 10_000


def scratch_database(url: str) -> str:
    """Drop and create the benchmark's database on the server of ``url``; its URL."""
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"DROP DATABASE IF EXISTS {DATABASE}"))
        conn.execute(text(f"CREATE DATABASE {DATABASE} CHARACTER SET utf8mb4"))
    admin.dispose()
    return make_url(url).set(database=DATABASE).render_as_string(hide_password=False)


def connect(url: str) -> pymysql.connections.Connection[Any]:
    """A plain PyMySQL connection to the database of a SQLAlchemy URL."""
    parsed = make_url(url)
    return pymysql.connect(
        host=parsed.host or "127.0.0.1",
        port=parsed.port or 3306,
        user=parsed.username or "root",
        password=parsed.password or "",
        database=parsed.database,
    )


def load(url: str, events: int) -> None:
    """Insert ``events`` rows into the buffer (multi-row INSERTs), then ANALYZE it; empty
    outbox's tables."""
    conn = connect(url)
    try:
        with conn.cursor() as cursor:
            for start in range(0, events, LOAD_CHUNK):
                rows = [
                    (n % 5000, "page_view") for n in range(start, min(events, start + LOAD_CHUNK))
                ]
                cursor.executemany(
                    "INSERT INTO bench_events (account_id, kind) VALUES (%s, %s)", rows
                )
            conn.commit()
            cursor.execute("ANALYZE TABLE bench_events")
            cursor.execute("DELETE FROM outbox_jobs")
            cursor.execute("DELETE FROM outbox_archive")
        conn.commit()
    finally:
        conn.close()


def remaining(url: str) -> int:
    conn = connect(url)
    try:
        with conn.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM bench_events")
            (count,) = cursor.fetchone()  # type: ignore[misc]
            return int(count)
    finally:
        conn.close()


def raw_loop(url: str, batch_size: int) -> None:
    """The raw loop: claim, read the group, delete it, until a claim finds nothing."""
    conn = connect(url)
    try:
        with conn.cursor() as cursor:
            cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
            while True:
                group = uuid.uuid4().hex
                cursor.execute(
                    "SELECT id FROM bench_events WHERE group_id IS NULL ORDER BY id LIMIT %s "
                    "FOR UPDATE SKIP LOCKED",
                    (batch_size,),
                )
                ids = [row[0] for row in cursor.fetchall()]
                if not ids:
                    conn.commit()
                    return
                marks = ",".join(["%s"] * len(ids))
                cursor.execute(
                    f"UPDATE bench_events SET group_id = %s WHERE id IN ({marks})", (group, *ids)
                )
                cursor.execute(
                    "SELECT id, account_id, kind FROM bench_events WHERE group_id = %s", (group,)
                )
                cursor.fetchall()
                conn.commit()
                cursor.execute("DELETE FROM bench_events WHERE group_id = %s", (group,))
                conn.commit()
    finally:
        conn.close()


def run_raw(url: str, processes: int, batch_size: int) -> float:
    """Seconds for P raw loops, each a process of its own, to drain."""
    command = [sys.executable, "-m", "benchmarks.drain_mariadb", "--raw", url, str(batch_size)]
    started = time.perf_counter()
    loops = [subprocess.Popen(command, cwd=ROOT) for _ in range(processes)]
    for loop in loops:
        if loop.wait() != 0:
            raise RuntimeError("a raw loop failed")
    return time.perf_counter() - started


def server_cpu() -> float | None:
    """CPU seconds the MariaDB server process has used, from /proc; None when not readable."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() != "mariadbd":
                continue
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return None


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--raw":
        raw_loop(sys.argv[2], int(sys.argv[3]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--url", default=DEFAULT_URL, help="a MariaDB server (its database is not used)"
    )
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--processes", default="1,2")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    if args.events < 1 or args.batch_size < 1 or args.runs < 1:
        parser.error("--events, --batch-size and --runs must be at least 1")
    process_counts = integers(args.processes)
    url = scratch_database(args.url)
    fresh_tables(url, Base.metadata)
    env = {
        **os.environ,
        "BENCH_BATCH_SIZE": str(args.batch_size),
        "BENCH_ARCHIVE": "0",
        "BENCH_MAX_BATCHES": "64",
    }
    results: dict[str, Any] = {
        "benchmark": "drain_mariadb",
        "command": command_line("benchmarks.drain_mariadb", args),
        "machine": machine(),
        "server": server_version(url),
        "events": args.events,
        "batch_size": args.batch_size,
        "worker_threads": DEFAULT_CONCURRENCY,
        "runs": args.runs,
        "rows": [],
    }
    for processes in process_counts:
        rates: dict[str, list[float]] = {"raw": [], "outbox": []}
        cpu: dict[str, list[tuple[float, float | None]]] = {"raw": [], "outbox": []}
        for run in range(args.runs):
            for variant in ("raw", "outbox"):
                load(url, args.events)
                client, server = children_cpu(), server_cpu()
                if variant == "raw":
                    seconds = run_raw(url, processes, args.batch_size)
                else:
                    seconds = run_framework(url, processes, DEFAULT_CONCURRENCY, env, separate=True)
                server_after = server_cpu()
                cpu[variant].append(
                    (
                        round(children_cpu() - client, 2),
                        None
                        if server is None or server_after is None
                        else round(server_after - server, 2),
                    )
                )
                left = remaining(url)
                if left:
                    raise RuntimeError(f"{variant} left {left} events behind")
                rates[variant].append(args.events / seconds)
                print(
                    f"P={processes} run {run + 1} {variant}: {args.events / seconds:,.0f}/s",
                    flush=True,
                )
        raw, ours = statistics.median(rates["raw"]), statistics.median(rates["outbox"])
        row = {
            "processes": processes,
            "raw_rates": [round(r) for r in rates["raw"]],
            "outbox_rates": [round(r) for r in rates["outbox"]],
            "raw_median": round(raw),
            "outbox_median": round(ours),
            "ratio": round(ours / raw, 3),
            "raw_cpu": [list(c) for c in cpu["raw"]],
            "outbox_cpu": [list(c) for c in cpu["outbox"]],
        }
        results["rows"].append(row)
        print(row, flush=True)
    print(f"results in {write('drain_mariadb', results)}")


def server_version(url: str) -> str:
    engine = create_engine(url)
    with engine.connect() as conn:
        version = str(conn.execute(text("SELECT VERSION()")).scalar())
    engine.dispose()
    return version


if __name__ == "__main__":
    main()
