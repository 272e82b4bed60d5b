"""Before and after: the wake-up latency of two revisions of outbox, taking turns round by round.

Each revision is checked out in a temporary git worktree and runs ``benchmarks.wakeup_latency``
from it (one run of ``--seconds`` at ``--rate`` events per second, in ``--mode``: ``notify``,
triggers and LISTEN, or ``polling``, no LISTEN and distribution every second) with the project's
virtual environment and that worktree first on ``PYTHONPATH``; the revisions alternate within
each round, so the machine's drift hits both alike. Each round keeps both revisions' p50 and
p99 (milliseconds, commit to handler start).

    python -m benchmarks.compare_latency --base 07b9e80 --head 8ce6ac2 --rounds 3
    python -m benchmarks.compare_latency --base 4234bf5 --head HEAD --mode polling --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks._common import command_line, machine, write
from benchmarks.drain_throughput import ROOT


def run_once(tree: Path, rate: float, seconds: float, mode: str) -> dict[str, float]:
    """One wake-up latency run of the revision checked out at ``tree``: p50 and p99, ms."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    command = [
        sys.executable, "-m", "benchmarks.wakeup_latency", "--rate", str(rate),
        "--seconds", str(seconds), "--runs", "1", "--modes", mode,
    ]  # fmt: skip
    subprocess.run(command, cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL)
    results = json.loads(
        (tree / "benchmarks/results" / f"wakeup_latency_{int(rate)}.json").read_text()
    )
    (run,) = results["runs"][mode]
    return {"p50_ms": float(run["p50_ms"]), "p99_ms": float(run["p99_ms"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the revision before (commit, tag, branch)")
    parser.add_argument("--head", required=True, help="the revision after")
    parser.add_argument("--rate", type=float, default=200.0, help="events per second")
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mode", choices=["notify", "polling"], default="notify")
    args = parser.parse_args()
    if args.rounds < 1 or args.seconds <= 0 or args.rate <= 0:
        parser.error("--rounds, --seconds and --rate must be above 0")
    rounds: dict[str, list[dict[str, float]]] = {"base": [], "head": []}
    with tempfile.TemporaryDirectory(prefix="outbox-compare-latency-") as scratch:
        trees = {side: Path(scratch) / side for side in rounds}
        for side, revision in (("base", args.base), ("head", args.head)):
            subprocess.run(
                ["git", "worktree", "add", "--detach", "-q", str(trees[side]), revision],
                cwd=ROOT,
                check=True,
            )
        try:
            for number in range(args.rounds):
                for side in rounds:
                    figures = run_once(trees[side], args.rate, args.seconds, args.mode)
                    rounds[side].append(figures)
                    print(f"round {number + 1} {side}: {figures}", flush=True)
        finally:
            for tree in trees.values():
                subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT)
    summary: dict[str, Any] = {}
    for side, revision in (("base", args.base), ("head", args.head)):
        summary[side] = {
            "revision": revision,
            "rounds": rounds[side],
            "p50_ms": statistics.median(r["p50_ms"] for r in rounds[side]),
            "p99_ms": statistics.median(r["p99_ms"] for r in rounds[side]),
        }
    results = {
        "benchmark": "compare_latency",
        "command": command_line("benchmarks.compare_latency", args),
        "machine": machine(),
        "rate_per_second": args.rate,
        "seconds": args.seconds,
        "mode": args.mode,
        **summary,
    }
    print(results, flush=True)
    name = f"compare_latency_{args.base}_{args.head}" + ("_polling" * (args.mode == "polling"))
    print(f"results in {write(name, results)}")


if __name__ == "__main__":
    main()
