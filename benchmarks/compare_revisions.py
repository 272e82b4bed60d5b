"""Before and after: the same drain run with two revisions of outbox, interleaved run by run.

Each revision is checked out in a temporary git worktree and run from the project's virtual
environment with that worktree first on ``PYTHONPATH``, so both use the same interpreter and
libraries; only outbox's code (and the bench app) differ. Per run and revision: ``outbox
distribute`` + ``outbox work --burst --processes P`` drain ``--events`` events (as
``drain_throughput`` does), and the rate and the CPU seconds of the processes and of
PostgreSQL's backends are kept. The revisions alternate within each run, so the machine's drift
hits both alike.

    python -m benchmarks.compare_revisions --base d1654bf --head a992439 --processes 1,2 --runs 4
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._common import CpuMeter, command_line, libpq_url, machine, scratch_database, write
from benchmarks.drain_throughput import APP, ROOT, integers, load, prepare, remaining

OUTBOX = Path(sys.executable).parent / "outbox"


def drain(url: str, tree: Path, processes: int, batch_size: int) -> float:
    """Seconds for one revision's `outbox distribute` + `outbox work --processes P`."""
    env = {**os.environ, "PYTHONPATH": str(tree), "BENCH_BATCH_SIZE": str(batch_size)}
    base = [str(OUTBOX), "--app", APP, "--database-url", url, "--log-level", "warning"]
    work = [*base, "work", "--burst", "--no-listen", "--processes", str(processes)]
    started = time.perf_counter()
    running = [
        subprocess.Popen(command, cwd=tree, env=env, stdout=subprocess.DEVNULL)
        for command in ([*base, "distribute"], work)
    ]
    if any(process.wait() != 0 for process in running):
        raise RuntimeError(f"an outbox process of {tree.name} failed")
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the revision before (commit, tag, branch)")
    parser.add_argument("--head", required=True, help="the revision after")
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--processes", default="1,2")
    parser.add_argument("--runs", type=int, default=4)
    args = parser.parse_args()
    try:
        process_counts = integers(args.processes)
    except argparse.ArgumentTypeError as error:
        parser.error(str(error))
    if args.runs < 1 or args.events < 1 or args.batch_size < 1:
        parser.error("--runs, --events and --batch-size must be positive")
    for name in ("base", "head"):
        found = subprocess.run(
            ["git", "rev-parse", "--verify", "--quiet", f"{getattr(args, name)}^{{commit}}"],
            cwd=ROOT,
            capture_output=True,
            check=False,
        )
        if found.returncode != 0:
            parser.error(f"--{name} {getattr(args, name)!r} is not a commit of this repository")
    url = scratch_database("outbox_bench_compare")
    dsn = libpq_url(url)
    results: dict[str, Any] = {
        "benchmark": "compare_revisions",
        "command": command_line("benchmarks.compare_revisions", args),
        "machine": machine(),
        "events": args.events,
        "batch_size": args.batch_size,
        "rows": [],
    }
    with tempfile.TemporaryDirectory(prefix="outbox-compare-") as scratch:
        trees = {}
        for name in ("base", "head"):
            revision = getattr(args, name)
            tree = Path(scratch) / name
            subprocess.run(
                ["git", "worktree", "add", "--detach", str(tree), revision],
                cwd=ROOT,
                check=True,
                capture_output=True,
            )
            trees[name] = tree
        try:
            prepare(url)
            meter = CpuMeter(dsn)
            for processes in process_counts:
                kept: dict[str, list[tuple[float, float, float | None]]] = {"base": [], "head": []}
                for run in range(args.runs):
                    for name, tree in trees.items():
                        load(dsn, args.events)
                        meter.start()
                        seconds = drain(url, tree, processes, args.batch_size)
                        client, server = meter.stop()
                        if remaining(dsn):
                            raise RuntimeError(f"{name} left events behind")
                        kept[name].append((args.events / seconds, client, server))
                        print(f"P={processes} run {run + 1} {name}: "
                              f"{args.events / seconds:,.0f}/s", flush=True)  # fmt: skip
                row: dict[str, Any] = {"processes": processes}
                for name, runs in kept.items():
                    servers = [r[2] for r in runs if r[2] is not None]
                    row[name] = {
                        "revision": getattr(args, name),
                        "rates": [round(r[0]) for r in runs],
                        "median": round(statistics.median(r[0] for r in runs)),
                        "processes_cpu": statistics.median(r[1] for r in runs),
                        "postgresql_cpu": statistics.median(servers) if servers else None,
                    }
                row["head_over_base"] = round(row["head"]["median"] / row["base"]["median"], 3)
                results["rows"].append(row)
                print(row, flush=True)
        finally:
            for tree in trees.values():
                subprocess.run(
                    ["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False
                )
    print(f"results in {write(f'compare_revisions_{args.base}_{args.head}', results)}")


if __name__ == "__main__":
    main()
