"""Against the peers: the same no-op jobs drained by outbox, pgqueuer and procrastinate.

N jobs (one per event, as each library's users would write them) wait in a scratch database of
their own per library; each is drained by a no-op task, timed from the start of the draining
processes to their exit (process start-up included, as in ``drain_throughput``), until none
is left. Enqueueing is not timed: outbox's events are loaded with COPY, pgqueuer's enqueued with
list ``enqueue`` calls, procrastinate's with ``batch_defer_async``.

* outbox: ``outbox distribute`` + one ``outbox work --burst`` process (its default concurrency,
  4 threads), batch size 1,000 (``drain_throughput``'s ``run_framework`` with one process).
* pgqueuer: one process (asyncpg driver, uvloop) running C QueueManagers in drain mode, each
  on its own connection, dequeuing B jobs at a time, for every ``CxB`` in ``--pgqueuer``.
* procrastinate: one process, one worker (PsycopgConnector, ``wait=False``) with C async
  sub-workers, for every C in ``--procrastinate``.

Every configuration runs once per round, ``--runs`` rounds; each peer's best configuration
(highest median) is the one compared. The target is set for as many jobs as the drain
benchmark's events, 200,000 (``JUDGED_JOBS``): that run is the judged one (``peers.json``); a
run with another ``--jobs`` is stored beside it as ``peers_<jobs>.json``, shown, not judged.

pgqueuer and procrastinate run with ``--peer-python`` (default ``.bench-venv/bin/python``): they
are never installed in the project's environment (``python3 -m venv .bench-venv &&
.bench-venv/bin/pip install -e . pgqueuer procrastinate asyncpg``).

Procrastinate is slow, so ``--procrastinate-jobs`` (default 5,000) is smaller than N; the ratios
are ratios of rates. pgqueuer's own benchmark dequeues 10 jobs at a time; with 200,000 jobs
waiting that drains about 300 jobs/s (11 minutes a run), and larger batches are its fastest, so
the default configurations start at 100.

    python -m benchmarks.peers --jobs 200000 --procrastinate-jobs 5000 --runs 3
    python -m benchmarks.peers --jobs 50000 --procrastinate-jobs 5000 --runs 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from benchmarks._common import command_line, libpq_url, machine, scratch_database, write
from benchmarks.drain_throughput import ROOT, load, prepare, remaining, run_framework
from outbox.worker import DEFAULT_CONCURRENCY

PEER_PYTHON = ROOT / ".bench-venv" / "bin" / "python"
JUDGED_JOBS = 200_000  # the drain benchmark's events: "the same number of no-op jobs"


def peer(python: Path, name: str, action: str, dsn: str, *extra: str) -> str:
    """Run one step of ``benchmarks._peer_drain`` in the peers' virtualenv; its output."""
    command = [str(python), "-m", "benchmarks._peer_drain", name, action, dsn, *extra]
    return subprocess.run(command, cwd=ROOT, check=True, capture_output=True, text=True).stdout


def timed_drain(python: Path, name: str, dsn: str, jobs: int, options: list[str]) -> float:
    """Enqueue ``jobs`` (untimed), then seconds for one drain process to empty the queue."""
    peer(python, name, "enqueue", dsn, str(jobs))
    started = time.perf_counter()
    peer(python, name, "drain", dsn, *options)
    seconds = time.perf_counter() - started
    left = int(peer(python, name, "remaining", dsn))
    if left:
        raise RuntimeError(f"{name} left {left} jobs behind")
    return seconds


def best(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return max(rows, key=lambda row: row["median"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=JUDGED_JOBS)
    parser.add_argument("--procrastinate-jobs", type=int, default=5000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--pgqueuer", default="5x100,2x500,5x500,5x1000", help="consumers x batch")
    parser.add_argument("--procrastinate", default="10,30", help="sub-worker concurrencies")
    parser.add_argument("--peer-python", type=Path, default=PEER_PYTHON)
    args = parser.parse_args()
    if min(args.jobs, args.procrastinate_jobs, args.runs) < 1:
        parser.error("--jobs, --procrastinate-jobs and --runs take at least 1")
    try:
        pgqueuer_configs = [
            tuple(int(part) for part in config.split("x", 1)) for config in args.pgqueuer.split(",")
        ]
        concurrencies = [int(c) for c in args.procrastinate.split(",")]
    except ValueError:
        parser.error("--pgqueuer takes CONSUMERSxBATCH,... and --procrastinate N,... (integers)")
    if any(len(c) != 2 or min(c) < 1 for c in pgqueuer_configs) or min(concurrencies) < 1:
        parser.error("--pgqueuer takes CONSUMERSxBATCH,... and --procrastinate N,... (>= 1)")
    proc_jobs = args.procrastinate_jobs
    python = args.peer_python
    results: dict[str, Any] = {
        "benchmark": "peers",
        "command": command_line("benchmarks.peers", args),
        "machine": machine(),
        "jobs": args.jobs,
        "procrastinate_jobs": proc_jobs,
        "runs": args.runs,
        "timing": "draining processes from start to exit, process start-up included",
        "versions": {
            "pgqueuer": peer(python, "pgqueuer", "version", "-").strip(),
            "procrastinate": peer(python, "procrastinate", "version", "-").strip(),
        },
    }

    def record(label: str, settings: dict[str, Any], rates: list[float]) -> dict[str, Any]:
        row = {**settings, "rates": [round(r) for r in rates],
               "median": round(statistics.median(rates))}  # fmt: skip
        print(f"{label} {settings}: median {row['median']:,}/s {row['rates']}", flush=True)
        return row

    # Every configuration runs once per round, so that the machine's drift over the minutes a
    # run takes affects all of them alike, not whichever ran last.
    url = scratch_database("outbox_bench_peers_outbox")
    outbox_dsn = libpq_url(url)
    env = {**os.environ, "BENCH_BATCH_SIZE": "1000", "BENCH_ARCHIVE": "0"}
    prepare(url)
    pgqueuer_dsn = libpq_url(scratch_database("outbox_bench_peers_pgqueuer"))
    peer(python, "pgqueuer", "setup", pgqueuer_dsn)
    procrastinate_dsn = libpq_url(scratch_database("outbox_bench_peers_procrastinate"))
    peer(python, "procrastinate", "setup", procrastinate_dsn)
    rates: dict[Any, list[float]] = {}
    for run in range(args.runs):
        load(outbox_dsn, args.jobs)
        seconds = run_framework(url, 1, DEFAULT_CONCURRENCY, env)
        if left := remaining(outbox_dsn):
            raise RuntimeError(f"outbox left {left} events behind")
        rates.setdefault("outbox", []).append(args.jobs / seconds)
        for consumers, batch in pgqueuer_configs:
            options = ["--consumers", str(consumers), "--batch-size", str(batch)]
            seconds = timed_drain(python, "pgqueuer", pgqueuer_dsn, args.jobs, options)
            rates.setdefault(("pgqueuer", consumers, batch), []).append(args.jobs / seconds)
        for concurrency in concurrencies:
            options = ["--concurrency", str(concurrency)]
            seconds = timed_drain(python, "procrastinate", procrastinate_dsn, proc_jobs, options)
            rates.setdefault(("procrastinate", concurrency), []).append(proc_jobs / seconds)
        print(f"round {run + 1} of {args.runs} done", flush=True)
    results["outbox"] = [
        record(
            "outbox",
            {"processes": 1, "threads": DEFAULT_CONCURRENCY, "batch_size": 1000},
            rates["outbox"],
        )
    ]
    results["pgqueuer"] = [
        record(
            "pgqueuer",
            {"driver": "asyncpg", "consumers": consumers, "batch_size": batch},
            rates[("pgqueuer", consumers, batch)],
        )
        for consumers, batch in pgqueuer_configs
    ]
    results["procrastinate"] = [
        record(
            "procrastinate",
            {"connector": "psycopg", "workers": 1, "concurrency": concurrency},
            rates[("procrastinate", concurrency)],
        )
        for concurrency in concurrencies
    ]

    ours = results["outbox"][0]["median"]
    results["ratios"] = {
        "outbox_over_pgqueuer_best": round(ours / best(results["pgqueuer"])["median"], 2),
        "outbox_over_procrastinate_best": round(ours / best(results["procrastinate"])["median"], 1),
        "targets": {"outbox_over_pgqueuer_best": 5, "outbox_over_procrastinate_best": 100},
    }
    print(results["ratios"], flush=True)
    name = "peers" if args.jobs == JUDGED_JOBS else f"peers_{args.jobs}"
    print(f"results in {write(name, results)}")


if __name__ == "__main__":
    main()
