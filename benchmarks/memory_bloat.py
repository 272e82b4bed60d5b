"""Memory and bloat: a worker's resident memory, and the buffer's size after a large drain.

1. ``outbox work --burst --concurrency 4`` drains ``--events`` events (batch 1,000); its
   resident set size is sampled from /proc every 50 ms: the peak is reported.
2. The buffer table and its indexes after the drain, before and after a plain VACUUM, and
   after ``outbox reindex`` (``REINDEX INDEX CONCURRENTLY`` of the bloated indexes, which does
   not block writers), against the empty table. VACUUM truncates the emptied heap, but B-tree
   pages emptied by the drain stay in the index files, free for reuse by the next events; only
   a rebuild returns them.

Each figure is the median of ``--runs`` runs, each on fresh tables; every run is kept.

    python -m benchmarks.memory_bloat --events 1000000 --runs 3
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

from benchmarks._common import command_line, libpq_url, machine, scratch_database, write
from benchmarks.drain_throughput import APP, OUTBOX, ROOT, load, prepare

SIZE = """
SELECT pg_relation_size('bench_events'), pg_indexes_size('bench_events'),
       pg_total_relation_size('bench_events')
"""


def buffer_sizes(dsn: str) -> dict[str, int]:
    with psycopg.connect(dsn) as conn:
        heap, indexes, total = conn.execute(SIZE).fetchone()  # type: ignore[misc]
    return {"heap_bytes": heap, "index_bytes": indexes, "total_bytes": total}


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def one_run(url: str, dsn: str, events: int) -> dict[str, Any]:
    """Fresh tables, a load, a drain (peak RSS sampled), VACUUM, ``outbox reindex``."""
    prepare(url)
    sizes = {"empty": buffer_sizes(dsn)}
    load(dsn, events)
    sizes["loaded"] = buffer_sizes(dsn)
    command = [str(OUTBOX), "--app", APP, "--database-url", url, "--log-level", "warning",
               "work", "--burst", "--concurrency", "4", "--no-listen"]  # fmt: skip
    worker = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL)
    peak = 0
    started = time.perf_counter()
    while worker.poll() is None:
        try:
            peak = max(peak, rss_kib(worker.pid))
        except OSError:
            break
        time.sleep(0.05)
    drain_seconds = time.perf_counter() - started
    if worker.returncode != 0:
        sys.exit(f"the worker failed with {worker.returncode}")
    sizes["drained"] = buffer_sizes(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM bench_events")
    sizes["vacuumed"] = buffer_sizes(dsn)
    started = time.perf_counter()
    reindex = [str(OUTBOX), "--app", APP, "--database-url", url, "reindex"]
    print(subprocess.run(reindex, cwd=ROOT, check=True, capture_output=True, text=True).stdout)
    reindex_seconds = time.perf_counter() - started
    sizes["reindexed"] = buffer_sizes(dsn)
    return {
        "worker_peak_rss_mib": round(peak / 1024, 1),
        "drain_seconds": round(drain_seconds, 1),
        "reindex_seconds": round(reindex_seconds, 2),
        "sizes": sizes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    url = scratch_database("outbox_bench_memory")
    dsn = libpq_url(url)
    runs = [one_run(url, dsn, args.events) for _ in range(args.runs)]

    sizes = {
        state: {
            key: round(statistics.median([run["sizes"][state][key] for run in runs]))
            for key in runs[0]["sizes"][state]
        }
        for state in runs[0]["sizes"]
    }
    results: dict[str, Any] = {
        "benchmark": "memory_bloat",
        "command": command_line("benchmarks.memory_bloat", args),
        "machine": machine(),
        "events": args.events,
        "worker_peak_rss_mib": statistics.median([run["worker_peak_rss_mib"] for run in runs]),
        "drain_seconds": statistics.median([run["drain_seconds"] for run in runs]),
        "reindex_seconds": statistics.median([run["reindex_seconds"] for run in runs]),
        "sizes": sizes,
        "vacuumed_over_empty": round(
            sizes["vacuumed"]["total_bytes"] / sizes["empty"]["total_bytes"], 2
        ),
        "reindexed_over_empty": round(
            sizes["reindexed"]["total_bytes"] / sizes["empty"]["total_bytes"], 2
        ),
        "runs": runs,
    }
    print(
        f"worker peak RSS {results['worker_peak_rss_mib']} MiB (median of {args.runs}); buffer "
        f"{sizes['empty']['total_bytes']} B empty, {sizes['loaded']['total_bytes']} B loaded, "
        f"{sizes['drained']['total_bytes']} B drained, {sizes['vacuumed']['total_bytes']} B "
        f"after VACUUM, {sizes['reindexed']['total_bytes']} B after outbox reindex",
        flush=True,
    )
    print(f"results in {write('memory_bloat', results)}")


if __name__ == "__main__":
    main()
