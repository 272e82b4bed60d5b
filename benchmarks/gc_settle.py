"""The garbage collector in a worker: Python's defaults against the ``outbox`` command's settings.

The ``outbox`` command freezes the heap its imports built and raises the collector's first
threshold once the application is loaded (``outbox.cli.settle_heap``). Measured both ways:

1. the collector's time during a drain of ``--events`` events by a ``Worker`` (four threads,
   batch 1,000) in this process, summed from ``gc.callbacks``;
2. how long a process that has imported outbox and the application takes to exit, from its
   last line to its end, ``--exits`` times.

    python -m benchmarks.gc_settle --events 200000 --exits 5
"""

from __future__ import annotations

import argparse
import gc
import logging
import statistics
import subprocess
import sys
import time
from typing import Any

import structlog

from benchmarks._common import command_line, libpq_url, machine, scratch_database, write
from benchmarks.drain_throughput import ROOT, load, prepare, remaining

EXIT_PROBE = """
import time
import outbox.cli, benchmarks.bench_app
{settle}
print(time.time(), flush=True)
"""


class CollectorClock:
    """Seconds the collector spent, per generation, while installed."""

    def __init__(self) -> None:
        self.seconds = {0: 0.0, 1: 0.0, 2: 0.0}
        self.collections = {0: 0, 1: 0, 2: 0}
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        generation = info["generation"]
        self.seconds[generation] += time.perf_counter() - self._started
        self.collections[generation] += 1


def drain_collector_seconds(url: str, dsn: str, events: int) -> dict[str, Any]:
    from benchmarks.bench_app import app
    from outbox.worker import Worker

    app.use_database(url)
    load(dsn, events)
    clock = CollectorClock()
    gc.callbacks.append(clock)
    try:
        Worker(app, concurrency=4, burst=True).run()
    finally:
        gc.callbacks.remove(clock)
    if left := remaining(dsn):
        raise RuntimeError(f"the worker left {left} events behind")
    return {
        "collector_seconds": round(sum(clock.seconds.values()), 3),
        "collections": clock.collections,
    }


def exit_seconds(settle: bool, times: int) -> float:
    """Median seconds from a loaded process's last line to its end."""
    code = EXIT_PROBE.format(settle="outbox.cli.settle_heap()" if settle else "")
    samples = []
    for _ in range(times):
        process = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True, text=True
        )
        samples.append(time.time() - float(process.stdout.split()[0]))
    return round(statistics.median(samples), 3)


def main() -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--exits", type=int, default=5)
    args = parser.parse_args()
    url = scratch_database("outbox_bench_gc")
    dsn = libpq_url(url)
    prepare(url)
    defaults = drain_collector_seconds(url, dsn, args.events)
    default_exit = exit_seconds(False, args.exits)
    from outbox.cli import settle_heap

    settle_heap()
    settled = drain_collector_seconds(url, dsn, args.events)
    settled_exit = exit_seconds(True, args.exits)
    results = {
        "benchmark": "gc_settle",
        "command": command_line("benchmarks.gc_settle", args),
        "machine": machine(),
        "events": args.events,
        "python_defaults": {**defaults, "exit_seconds": default_exit},
        "settled": {**settled, "exit_seconds": settled_exit},
    }
    print(results["python_defaults"], results["settled"], sep="\n")
    print(f"results in {write('gc_settle', results)}")


if __name__ == "__main__":
    main()
