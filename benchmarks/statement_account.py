r"""The statement account: every statement a drain sends PostgreSQL, per group, from
``pg_stat_statements``, outbox beside the raw loop.

    python -m benchmarks.statement_account --events 200000 --batch-size 1000 --processes 1,2

``--variants 'burst, P=1;rate limit'`` runs only those (``--results NAME``: the file they go
to in ``benchmarks/results/``, so that a partial run leaves the whole one's alone).

``pg_stat_statements`` must be preloaded, which the machine's own server is not (and should
not be for this: other work shares it), so the benchmark starts a private PostgreSQL 15 cluster
of its own (``initdb`` and ``pg_ctl`` into a temporary directory, on ``--port``, as the
``postgres`` user when run as root), with ``pg_stat_statements.track = all`` and
``track_planning`` on, and removes it at the end. The drains connect as a role of their own,
``outbox_drain``; the benchmark's own statements (loading, watching the buffer) run as
``postgres`` and are left out of the account, as is anything before the reset.

For each variant: the buffer is loaded with ``--events`` events (COPY, as
``benchmarks.drain_throughput`` loads it; the bench app's no-op handler, its batch size
``--batch-size``), ``pg_stat_statements_reset()``, the drain, then ``pg_stat_statements``
read: calls of each statement, calls per group (groups = events / batch size), total and mean
execution time, planning time, rows. Variants:

- ``burst``: ``outbox work --burst --no-listen --processes P`` (distributing by itself), for each
  P of ``--processes``: the worker's bookkeeping as in production (heartbeats with its lease
  extensions, throughput records, reading pauses and breakers, the claim job given back to the
  job table every second); none of it can be turned off, so each shows as its share of a group;
- ``running``: a long-running ``outbox work --no-listen`` (distributing every second as the
  fleet's leader), stopped with SIGTERM once the buffer is empty: the baseline of ``paused``;
- ``paused``: the same, the handler paused (``outbox.ops.flow.pause``, as ``outbox_drain``: the
  operations layer's record is in the account) once a quarter of the events are handled, and
  resumed (``outbox.ops.flow.resume``) two seconds later;
- ``rate limit``: the burst worker, the handler under ``RateLimit(calls=100000, per=1)``, a
  limit it never meets: what reserving a turn costs;
- ``concurrency cap``: the burst worker, the handler capped at 2 groups in flight fleet-wide;
- ``circuit breaker``: the burst worker, the handler with ``CircuitBreaker(failures=5)``, which
  stays closed;
- ``raw``: ``benchmarks._raw_drain`` ``by-address`` (outbox's claim form), P loops.

The CPU seconds of the server's backends (``benchmarks._common.CpuMeter``) are shown beside
the time ``pg_stat_statements`` counts (execution plus planning): that time includes waiting
(row locks, I/O, WAL flushes), the CPU parsing, the protocol and connections, which it does
not. One run of each; the counts are exact, the
times are this machine's at the moment (compare side by side, as ratios).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg

from benchmarks._common import CpuMeter, command_line, machine, write
from benchmarks.bench_app import BenchEvent
from benchmarks.drain_throughput import APP, OUTBOX, ROOT, load, prepare
from outbox import Batch, Outbox
from outbox.ops import flow

BIN = Path("/usr/lib/postgresql/15/bin")
DATABASE = "statement_account"
DRAIN_ROLE = "outbox_drain"
HANDLER = "noop"  # the bench app's handler of the plain buffer
PAUSE_AT = 1 / 4  # of the events handled when the handler is paused
PAUSE_SECONDS = 2.0
RATE_LIMIT_CALLS = 100_000  # per second: a limit the drain never meets
CONCURRENCY_CAP = 2
BREAKER_FAILURES = 5
SETTINGS = {
    "shared_preload_libraries": "pg_stat_statements",
    "pg_stat_statements.track": "all",
    "pg_stat_statements.track_planning": "on",
    "pg_stat_statements.max": "10000",
    "compute_query_id": "on",
    "listen_addresses": "127.0.0.1",
}


class Cluster:
    """A private PostgreSQL 15 cluster in a temporary directory, for one run."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.directory = Path(tempfile.mkdtemp(prefix="outbox-statement-account-"))
        self.data = self.directory / "data"
        self._as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    def _run(self, *command: str) -> None:
        subprocess.run([*self._as_postgres, *command], check=True, stdout=subprocess.DEVNULL)

    def start(self) -> None:
        if self._as_postgres:
            shutil.chown(self.directory, "postgres", "postgres")
        self._run(str(BIN / "initdb"), "-D", str(self.data), "-U", "postgres",
                  "--auth=trust", "--no-sync", "-E", "UTF8")  # fmt: skip
        options = " ".join(f"-c {name}={value}" for name, value in SETTINGS.items())
        options += f" -p {self.port} -c unix_socket_directories={self.directory}"
        self._run(str(BIN / "pg_ctl"), "-D", str(self.data), "-l",
                  str(self.directory / "server.log"), "-o", options, "-w", "start")  # fmt: skip

    def stop(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            if (self.data / "postmaster.pid").exists():
                self._run(str(BIN / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")
        shutil.rmtree(self.directory, ignore_errors=True)

    def dsn(self, database: str = "postgres", user: str = "postgres") -> str:
        return f"postgresql://{user}@127.0.0.1:{self.port}/{database}"

    def url(self, database: str = DATABASE, user: str = DRAIN_ROLE) -> str:
        return f"postgresql+psycopg://{user}@127.0.0.1:{self.port}/{database}"


@contextlib.contextmanager
def cluster(port: int) -> Iterator[Cluster]:
    """A started private cluster with the account's database and role, removed at the end."""
    server = Cluster(port)
    try:
        server.start()
        with psycopg.connect(server.dsn(), autocommit=True) as conn:
            conn.execute(f"CREATE ROLE {DRAIN_ROLE} LOGIN SUPERUSER")
            conn.execute(f"CREATE DATABASE {DATABASE} OWNER {DRAIN_ROLE}")
        with psycopg.connect(server.dsn(DATABASE), autocommit=True) as conn:
            conn.execute("CREATE EXTENSION pg_stat_statements")
        yield server
    finally:
        server.stop()


def free_port(preferred: int) -> int:
    """``preferred`` when nothing listens there, else a port the system picks."""
    for port in (preferred, 0):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(probe.getsockname()[1])
    raise RuntimeError("no free port")


# --- what a statement is called -------------------------------------------------------------

# Known statements, by a fragment of their normalised text: the first that matches names it.
LABELS: list[tuple[str, str]] = [
    (r"^BEGIN", "BEGIN"),
    (r"^COMMIT", "COMMIT"),
    (r"^ROLLBACK", "ROLLBACK (a read's connection back to the pool)"),
    (r"^WITH held AS \(UPDATE outbox_jobs", "claim: rows, batch job, more? (one statement)"),
    (r"^WITH claimable AS \(\s*SELECT ctid FROM bench_events.*RETURNING", "raw: claim"),
    (r"^DELETE FROM bench_events WHERE group_id", "raw: delete the group"),
    (r"^WITH job AS \(DELETE FROM outbox_jobs", "finish: delete group and job (one statement)"),
    (r"^WITH claimable AS \(SELECT ctid FROM bench_events", "claim the rows (no lease)"),
    (r"^SELECT bench_events\.id FROM bench_events WHERE bench_events\.group_id IS NULL",
     "claim: any more unclaimed?"),
    (r"^SELECT bench_events\..* WHERE bench_events\.group_id = ", "load the group's rows"),
    (r"^INSERT INTO outbox_jobs \(kind, handler, group_id", "insert the batch job"),
    (r"pg_advisory_xact_lock", "cap: lock the handler"),
    (r"^SELECT count\(\*\) AS count_1 FROM outbox_jobs", "cap: count in flight"),
    (r"^UPDATE outbox_workers SET heartbeat_at", "heartbeat"),
    (r"outbox_throughput", "throughput record"),
    (r"^SELECT outbox_handlers\.name, outbox_handlers\.paused_at", "read pauses and breakers"),
    (r"^INSERT INTO outbox_jobs \(kind, handler, slot", "distribute: insert claim jobs"),
    (r"^SELECT outbox_jobs\.slot", "distribute: claim job slots"),
    (r"^SELECT count\(\*\) AS count_1 FROM \(SELECT .* FROM bench_events",
     "distribute: count unclaimed"),
    (r"pg_notify", "distribute: notify"),
    (r"^WITH picked AS \(SELECT outbox_jobs\.id AS id FROM outbox_jobs WHERE outbox_jobs"
     r"\.lease_token IS NULL", "acquire due jobs"),
    (r"^WITH picked AS \(SELECT outbox_jobs\.id AS id FROM outbox_jobs WHERE outbox_jobs"
     r"\.lease_token IS NOT NULL", "rescue expired leases"),
    (r"^UPDATE outbox_jobs SET run_at=", "give the claim job back"),
    (r"^DELETE FROM outbox_jobs WHERE outbox_jobs\.handler = .* AND outbox_jobs\.kind",
     "delete pending claim jobs"),
    (r"^DELETE FROM outbox_jobs WHERE outbox_jobs\.id", "delete the claim job"),
    (r"^INSERT INTO outbox_rate_limits", "rate limit: make its rows"),
    (r"^SELECT outbox_rate_limits\.key FROM .* FOR UPDATE", "rate limit: lock its rows"),
    (r"^SELECT outbox_rate_limits\.key, outbox_rate_limits\.starts.* FOR UPDATE",
     "rate limit: lock its rows, read windows"),
    (r"^SELECT outbox_rate_limits\.key, outbox_rate_limits\.starts", "rate limit: read windows"),
    (r"^UPDATE outbox_rate_limits", "rate limit: reserve the turn"),
    (r"^UPDATE outbox_jobs SET lease_expires_at", "extend leases"),
    (r"outbox_operations", "operation record (pause, resume)"),
    (r"^UPDATE outbox_handlers SET paused_at", "pause or resume the handler"),
    (r"^SELECT outbox_handlers\.failures, outbox_handlers\.trips", "breaker: read its count"),
    (r"outbox_handlers", "handler row"),
    (r"outbox_workers", "worker registry"),
    (r"outbox_schema", "start: schema generation"),
    (r"pg_settings|^SET |^show |current_schema|pg_catalog\.version|FROM pg_type|SAVEPOINT|RELEASE",
     "connection set-up"),
    (r"pg_class", "start: tables exist?"),
]  # fmt: skip
_LABELS = [(re.compile(pattern, re.S), label) for pattern, label in LABELS]


def flat(query: str) -> str:
    return " ".join(query.split())


def label(query: str) -> str:
    """A readable name for a statement: a known one's, or its verb and first table."""
    text = flat(query)
    for pattern, name in _LABELS:
        if pattern.search(text):
            return name
    words = re.findall(r"(INSERT INTO|UPDATE|DELETE FROM|FROM)\s+([\w.]+)", text)
    return " ".join(words[0]).lower() if words else text.split(" ", 1)[0].lower()


# --- one drain ------------------------------------------------------------------------------


def noop(batch: Batch[BenchEvent]) -> None:
    """The operator's copy of the bench app's handler: pausing names a registered handler."""


def remaining(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        return int(conn.execute("SELECT count(*) FROM bench_events").fetchone()[0])  # type: ignore[index]


def outbox_command(url: str, *words: str) -> list[str]:
    return [str(OUTBOX), "--app", APP, "--database-url", url, "--log-level", "warning", *words]


def run_burst(url: str, processes: int, env: dict[str, str]) -> None:
    command = outbox_command(url, "work", "--burst", "--no-listen", "--processes", str(processes))
    subprocess.run(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, check=True)


def run_until_empty(
    url: str, watch: str, events: int, env: dict[str, str], *, pause: bool
) -> dict[str, float]:
    """A long-running worker, stopped once the buffer is empty; ``pause``: the handler paused
    for ``PAUSE_SECONDS`` once ``PAUSE_AT`` of the events are handled, by an operator in this
    process connected as the drain's role. Seconds of each step, and the events left."""
    started = time.perf_counter()
    steps: dict[str, float] = {}
    worker = subprocess.Popen(
        outbox_command(url, "work", "--no-listen"), cwd=ROOT, env=env, stdout=subprocess.DEVNULL
    )
    try:
        paused = not pause
        while (left := remaining(watch)) > 0:
            if worker.poll() is not None:
                raise RuntimeError("the worker stopped before the buffer was empty")
            if not paused and left <= events * (1 - PAUSE_AT):
                operator = Outbox(url)
                operator.handler(BenchEvent, name=HANDLER)(noop)
                flow.pause(operator, HANDLER)
                steps["paused_at"] = round(time.perf_counter() - started, 2)
                steps["left_when_paused"] = remaining(watch)
                time.sleep(PAUSE_SECONDS)
                steps["left_when_resumed"] = remaining(watch)
                flow.resume(operator, HANDLER)
                operator.engine.dispose()
                paused = True
            time.sleep(0.05)
        steps["empty_at"] = round(time.perf_counter() - started, 2)
    finally:
        worker.send_signal(signal.SIGTERM)
        if worker.wait(timeout=60) != 0:
            raise RuntimeError("the worker failed")
    return steps


def run_raw(dsn: str, processes: int, batch_size: int) -> None:
    command = [sys.executable, "-m", "benchmarks._raw_drain", dsn, str(batch_size), "by-address"]
    loops = [subprocess.Popen(command, cwd=ROOT) for _ in range(processes)]
    for loop in loops:
        if loop.wait() != 0:
            raise RuntimeError("a raw loop failed")


def reset(server: Cluster) -> None:
    with psycopg.connect(server.dsn(DATABASE), autocommit=True) as conn:
        conn.execute("SELECT pg_stat_statements_reset()")


def account(server: Cluster, groups: int, events: int) -> dict[str, Any]:
    """What ``pg_stat_statements`` counted for the drain's role in the account's database."""
    query = """
        SELECT s.query, s.toplevel, s.calls, s.total_exec_time, s.total_plan_time, s.plans,
               s.rows
        FROM pg_stat_statements AS s
        JOIN pg_roles AS r ON r.oid = s.userid
        JOIN pg_database AS d ON d.oid = s.dbid
        WHERE r.rolname = %s AND d.datname = %s
        ORDER BY s.calls DESC, s.total_exec_time DESC
    """
    with psycopg.connect(server.dsn(DATABASE), autocommit=True) as conn:
        found = conn.execute(query, (DRAIN_ROLE, DATABASE)).fetchall()
    statements = []
    for text, toplevel, calls, exec_ms, plan_ms, plans, rows in found:
        statements.append({
            "label": label(text),
            "query": flat(text),
            "toplevel": toplevel,
            "calls": calls,
            "calls_per_group": round(calls / groups, 3),
            "total_exec_ms": round(exec_ms, 2),
            "mean_exec_ms": round(exec_ms / calls, 4) if calls else 0.0,
            "total_plan_ms": round(plan_ms, 2),
            "plans": plans,
            "rows": rows,
        })  # fmt: skip
    top = [s for s in statements if s["toplevel"]]
    calls = sum(s["calls"] for s in top)
    server_ms = sum(s["total_exec_ms"] + s["total_plan_ms"] for s in top)
    return {
        "statements": statements,
        "calls": calls,
        "calls_per_group": round(calls / groups, 3),
        "calls_per_event": round(calls / events, 5),
        "exec_ms": round(sum(s["total_exec_ms"] for s in top), 1),
        "plan_ms": round(sum(s["total_plan_ms"] for s in top), 1),
        "server_ms_per_group": round(server_ms / groups, 3),
        "server_us_per_event": round(1000 * server_ms / events, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--processes", default="1,2", help="comma-separated process counts")
    parser.add_argument("--port", type=int, default=5499, help="the private cluster's port")
    parser.add_argument(
        "--variants",
        default="",
        help="semicolon-separated variants to run (all by default): 'burst, P=1;rate limit'",
    )
    parser.add_argument("--results", default="statement_account",
                        help="the results file's name, in benchmarks/results/")  # fmt: skip
    args = parser.parse_args()
    if not 0 < args.batch_size <= args.events:
        parser.error("--batch-size must be at least 1 and at most --events")
    processes = [int(p) for p in args.processes.split(",")]
    groups = -(-args.events // args.batch_size)
    env = {**os.environ, "BENCH_BATCH_SIZE": str(args.batch_size), "BENCH_ARCHIVE": "0",
           "BENCH_TYPED": "", "BENCH_RATE_LIMIT": "", "BENCH_CONCURRENCY": "",
           "BENCH_BREAKER": ""}  # fmt: skip
    variants: list[tuple[str, int, dict[str, str]]] = [
        *((f"raw, P={p}", p, {}) for p in processes),
        *((f"burst, P={p}", p, {}) for p in processes),
        ("running", 1, {}),
        ("paused", 1, {}),
        ("rate limit", 1, {"BENCH_RATE_LIMIT": str(RATE_LIMIT_CALLS)}),
        ("concurrency cap", 1, {"BENCH_CONCURRENCY": str(CONCURRENCY_CAP)}),
        ("circuit breaker", 1, {"BENCH_BREAKER": str(BREAKER_FAILURES)}),
    ]
    if args.variants:
        wanted = {name.strip() for name in args.variants.split(";") if name.strip()}
        unknown = wanted - {name for name, _, _ in variants}
        if unknown:
            parser.error(f"no such variant: {', '.join(sorted(unknown))}")
        variants = [v for v in variants if v[0] in wanted]
    results: dict[str, Any] = {
        "benchmark": "statement_account",
        "command": command_line("benchmarks.statement_account", args),
        "machine": machine(),
        "server": {"version": "15", "settings": SETTINGS},
        "events": args.events,
        "batch_size": args.batch_size,
        "groups": groups,
        "variants": [],
    }
    with cluster(free_port(args.port)) as server:
        url, dsn, watch = server.url(), server.dsn(DATABASE, DRAIN_ROLE), server.dsn(DATABASE)
        prepare(url)
        meter = CpuMeter(watch)
        for name, count, extra in variants:
            load(dsn, args.events)
            reset(server)
            load_average = round(os.getloadavg()[0], 2)
            meter.start()
            started = time.perf_counter()
            steps: dict[str, float] = {}
            if name.startswith("raw"):
                run_raw(dsn, count, args.batch_size)
            elif name in ("running", "paused"):
                steps = run_until_empty(url, watch, args.events, {**env, **extra},
                                        pause=name == "paused")  # fmt: skip
            else:
                run_burst(url, count, {**env, **extra})
            seconds = time.perf_counter() - started
            client_cpu, server_cpu = meter.stop()
            left = remaining(watch)
            if left:
                raise RuntimeError(f"{name} left {left} events behind")
            row = {
                "variant": name,
                "processes": count,
                "seconds": round(seconds, 2),
                "load_average": load_average,
                "client_cpu_seconds": client_cpu,
                "server_cpu_seconds": server_cpu,
                **({"steps": steps} if steps else {}),
                **account(server, groups, args.events),
            }
            results["variants"].append(row)
            print(f"{name}: {row['calls_per_group']} statements/group, "
                  f"{row['server_ms_per_group']} ms/group in the server "
                  f"(backends' CPU {server_cpu} s), {seconds:.1f} s", flush=True)  # fmt: skip
    print(f"results in {write(args.results, results)}")


if __name__ == "__main__":
    main()
