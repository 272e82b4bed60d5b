"""Ingest over HTTP: events written into a PostgreSQL buffer through the console's batch
endpoint by concurrent producers that retry at random, served by one uvicorn process.

``--producers`` clients (asyncio, httpx) each send batches of ``--batch`` events with keys of
their own; after each batch, a producer sends it again with probability ``--retry`` (a retry
after a timeout). The figure is the unique events written per second, from the first request
to the last answer; then the buffer is checked: every key written once, none lost, none twice.

    python -m benchmarks.ingest_http --events 200000 --batch 500 --producers 8 --runs 3
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psycopg

from benchmarks._common import (
    command_line,
    drop_database,
    fresh_tables,
    libpq_url,
    machine,
    scratch_database,
    write,
)
from benchmarks.bench_app import Base

TOKEN = "benchmark-producer-token-0123456789"  # noqa: S105 - a loopback benchmark's own token
DATABASE = "outbox_bench_ingest"
TARGET_EVENTS_PER_SECOND = 5000.0


def start_server(url: str, port: int) -> subprocess.Popen[bytes]:
    """The console in a process of its own, as `outbox dashboard` runs it."""
    env = {"BENCH_DATABASE_URL": url, "OUTBOX_WEB_TOKENS": f"bench:producer:{TOKEN}"}
    server = subprocess.Popen(
        [sys.executable, "-m", "benchmarks._ingest_server", str(port)],
        cwd=Path(__file__).resolve().parents[1],
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return server
        except httpx.TransportError:
            time.sleep(0.1)
    server.kill()
    raise RuntimeError("the console did not start")


async def produce(
    base: str, producer: int, events: int, batch: int, retry: float, seed: int
) -> tuple[int, int]:
    """Send ``events`` events in batches, each batch again with probability ``retry``;
    (requests sent, events the server said it wrote now)."""
    rng = random.Random(seed * 1000 + producer)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    sent = written = 0
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=60) as client:
        for start in range(0, events, batch):
            body = {
                "events": [
                    {
                        "key": f"p{producer}-{n}",
                        "values": {"account_id": n % 5000, "kind": "ingest"},
                    }
                    for n in range(start, min(start + batch, events))
                ]
            }
            for _ in range(2 if rng.random() < retry else 1):
                response = await client.post("/api/v1/handlers/bench/events", json=body)
                response.raise_for_status()
                sent += 1
                written += response.json()["written"]
    return sent, written


async def run_once(
    base: str, events: int, batch: int, producers: int, retry: float, seed: int
) -> dict[str, float]:
    each = events // producers
    started = time.perf_counter()
    results = await asyncio.gather(
        *(produce(base, p, each, batch, retry, seed) for p in range(producers))
    )
    seconds = time.perf_counter() - started
    return {
        "seconds": round(seconds, 3),
        "events": each * producers,
        "requests": sum(r[0] for r in results),
        "written_answers": sum(r[1] for r in results),
        "events_per_second": round(each * producers / seconds, 1),
    }


def check(dsn: str) -> dict[str, int]:
    """Events in the buffer, distinct keys recorded, and keys written more than once."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT count(*) FROM bench_events").fetchone()
        keys = conn.execute("SELECT count(*) FROM outbox_ingest_keys").fetchone()
        twice = conn.execute(
            "SELECT count(*) FROM (SELECT event_id FROM outbox_ingest_keys "
            "GROUP BY event_id HAVING count(*) > 1) AS t"
        ).fetchone()
    assert rows is not None
    assert keys is not None
    assert twice is not None
    return {
        "buffer_rows": int(rows[0]),
        "keys": int(keys[0]),
        "events_shared_by_keys": int(twice[0]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--producers", type=int, default=8)
    parser.add_argument("--retry", type=float, default=0.2)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--port", type=int, default=28766)
    args = parser.parse_args()
    url = scratch_database(DATABASE)
    runs = []
    try:
        for seed in range(args.runs):
            fresh_tables(url, Base.metadata)
            server = start_server(url, args.port)
            try:
                run = asyncio.run(
                    run_once(
                        f"http://127.0.0.1:{args.port}",
                        args.events,
                        args.batch,
                        args.producers,
                        args.retry,
                        seed,
                    )
                )
            finally:
                server.terminate()
                server.wait(20)
            run.update(check(libpq_url(url)))
            run["lost"] = run["events"] - run["buffer_rows"]
            runs.append(run)
            print(run)
    finally:
        drop_database(DATABASE)
    rates = [r["events_per_second"] for r in runs]
    data = {
        "benchmark": "ingest_http",
        "command": command_line("benchmarks.ingest_http", args),
        "machine": machine(),
        "runs": runs,
        "events_per_second": rates,
        "median_events_per_second": statistics.median(rates),
        "target_events_per_second": TARGET_EVENTS_PER_SECOND,
        "lost": sum(r["lost"] for r in runs),
        "duplicated": sum(r["buffer_rows"] - r["keys"] for r in runs),
    }
    median = data["median_events_per_second"]
    print(f"median {median} events/s; lost {data['lost']}, duplicated {data['duplicated']}")
    print(f"written to {write('ingest_http', data)}")


if __name__ == "__main__":
    main()
