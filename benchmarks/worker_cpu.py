"""The worker's own CPU per event in steady state, apart from its start-up: two revisions of
outbox and the raw loop, side by side in one run.

One ``outbox work --burst --no-listen`` process (``--concurrency`` threads, the bench app's
handler, batch ``--batch-size``) drains ``--events`` events, and drains an empty buffer: the
difference of the CPU seconds the process spent (``RUSAGE_CHILDREN``, start-up and exit
included in both) over the events is its CPU per event in steady state; the empty drain is its
start-up and exit. The raw loop (``benchmarks._raw_drain``, claiming by address and fetching
the same columns) is measured the same way. ``--base REV`` runs that revision of outbox as well,
from a temporary git worktree first on ``PYTHONPATH`` (the same interpreter and libraries);
the variants take turns, run by run, so the machine's drift hits them alike. ``--typed json``
or ``--typed events``: the JSON or the typed buffer, its handler reading ``batch.events``.

    python -m benchmarks.worker_cpu --events 300000 --runs 3 --base 5a376df
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks._common import command_line, libpq_url, machine, scratch_database, write
from benchmarks.drain_throughput import APP, JSON_BUFFER, PLAIN, ROOT, TYPED, load, prepare

OUTBOX = Path(sys.executable).parent / "outbox"


def cpu_of(command: list[str], cwd: Path, env: dict[str, str]) -> float:
    """CPU seconds (user and system) a command and its children spent."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(command, cwd=cwd, env=env, check=True, stdout=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=300_000)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--base", help="a revision of outbox to measure as well")
    parser.add_argument("--typed", choices=("events", "json"), help="the typed or JSON buffer")
    args = parser.parse_args()
    if args.events < 1 or args.runs < 1 or args.batch_size < 1 or args.concurrency < 1:
        parser.error("--events, --runs, --batch-size and --concurrency must be positive")
    table = {None: PLAIN, "events": TYPED, "json": JSON_BUFFER}[args.typed]
    url = scratch_database("outbox_bench_worker_cpu")
    dsn = libpq_url(url)
    prepare(url)
    env = {**os.environ, "BENCH_BATCH_SIZE": str(args.batch_size), "BENCH_TYPED": args.typed or ""}
    raw_options = {None: [], "events": ["typed"], "json": ["json"]}[args.typed]
    raw = [sys.executable, "-m", "benchmarks._raw_drain", dsn, str(args.batch_size), "by-address"]
    work = ["work", "--burst", "--no-listen", "--concurrency", str(args.concurrency)]
    trees: dict[str, Path] = {"head": ROOT}
    scratch = Path(tempfile.mkdtemp(prefix="outbox-worker-cpu-"))
    try:
        if args.base:
            trees["base"] = scratch / "base"
            subprocess.run(
                ["git", "worktree", "add", "--detach", str(trees["base"]), args.base],
                cwd=ROOT, check=True, capture_output=True,
            )  # fmt: skip
        variants: dict[str, tuple[list[str], Path, dict[str, str]]] = {
            "raw": (raw + raw_options, ROOT, env)
        }
        for name, tree in trees.items():
            base = [str(OUTBOX), "--app", APP, "--database-url", url, "--log-level", "warning"]
            variants[name] = ([*base, *work], tree, {**env, "PYTHONPATH": str(tree)})
        seconds: dict[str, dict[str, list[float]]] = {v: {"idle": [], "full": []} for v in variants}
        for run in range(args.runs):
            for name, (command, tree, variant_env) in variants.items():
                for kind, events in (("idle", 0), ("full", args.events)):
                    load(dsn, events, table=table)
                    seconds[name][kind].append(cpu_of(command, tree, variant_env))
                idle, full = seconds[name]["idle"][-1], seconds[name]["full"][-1]
                print(f"run {run + 1} {name}: start-up {idle:.2f} s, "
                      f"{(full - idle) / args.events * 1e6:.2f} us/event", flush=True)  # fmt: skip
    finally:
        if "base" in trees:
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(trees["base"])], cwd=ROOT, check=False
            )
    rows: list[dict[str, Any]] = []
    for name, measured in seconds.items():
        per_event = [
            (full - idle) / args.events * 1e6
            for idle, full in zip(measured["idle"], measured["full"], strict=True)
        ]
        rows.append(
            {
                "variant": name,
                "revision": args.base if name == "base" else ("HEAD" if name == "head" else None),
                "start_up_seconds": [round(s, 3) for s in measured["idle"]],
                "start_up_median": round(statistics.median(measured["idle"]), 3),
                "us_per_event": [round(u, 3) for u in per_event],
                "us_per_event_median": round(statistics.median(per_event), 3),
            }
        )
    results = {
        "benchmark": "worker_cpu",
        "command": command_line("benchmarks.worker_cpu", args),
        "machine": machine(),
        "events": args.events,
        "batch_size": args.batch_size,
        "concurrency": args.concurrency,
        "typed": args.typed,
        "runs": args.runs,
        "rows": rows,
    }
    name = "worker_cpu" + (f"_{args.typed}" if args.typed else "")
    print(f"results in {write(name, results)}")


if __name__ == "__main__":
    main()
