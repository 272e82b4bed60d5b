"""Draining through a rate-limited bulk API, against the theoretical minimum.

``--events`` events wait in a buffer on PostgreSQL; ``outbox work --processes P`` sends them,
``--batch-size`` per call, to the fake bulk API of the marketing example, which allows
``--api-calls-per-second`` calls in any second and answers more with 429 and Retry-After. The
handler keeps a fleet-wide ``RateLimit`` of ``--limit-fraction`` of the API's rate (``--spacing
B``: its ``burst``, calls spaced out); with ``--accounts K``, the events belong to K accounts,
grouped by account, and each account is also limited to ``--account-calls-per-second`` (a
second limit, per key). Timed from starting the command until the buffer is empty (process
start-up included), against the theoretical minimum (``events / batch size / rate``, or an
account's calls at its own rate if that is longer); the ratio is minimum / measured (1: as
fast as the API allows). The most calls in any one second, as the API saw them arrive and as
the handler's entry saw them start, say whether the limits held.

    python -m benchmarks.drain_rate_limited --events 100000 --batch-size 500 \\
        --api-calls-per-second 10 --limit-fraction 1 --processes 4 --runs 3
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sqlalchemy import create_engine, func, insert, select

from benchmarks._common import command_line, fresh_tables, machine, scratch_database, write
from benchmarks.bulk_app import Base, BulkEvent
from examples.marketing_sync.fake_api import FakeMarketingAPIProcess, most_in_a_second

ROOT = Path(__file__).resolve().parents[1]
OUTBOX = Path(sys.executable).parent / "outbox"
DATABASE = "outbox_bench_rate_limited"
LOAD_CHUNK = 10_000
POLL_SECONDS = 0.05


def prepare(url: str, events: int, accounts: int) -> None:
    """Fresh framework tables and a buffer of ``events`` events."""
    fresh_tables(url, Base.metadata)
    engine = create_engine(url)
    with engine.begin() as conn:
        for start in range(0, events, LOAD_CHUNK):
            rows = [
                {"email": f"user{n}@example.com", "account": n % max(accounts, 1)}
                for n in range(start, min(start + LOAD_CHUNK, events))
            ]
            conn.execute(insert(BulkEvent), rows)
    engine.dispose()


def drain(url: str, api: FakeMarketingAPIProcess, args: argparse.Namespace, starts: Path) -> float:
    """Seconds from starting ``outbox work`` until the buffer is empty."""
    env = {
        **os.environ,
        "BULK_API_URL": api.url,
        "BULK_BATCH_SIZE": str(args.batch_size),
        "BULK_CALLS_PER_SECOND": str(args.api_calls_per_second * args.limit_fraction),
        "BULK_ACCOUNT_CALLS": str(args.account_calls_per_second if args.accounts else 0),
        "BULK_BURST": str(args.spacing or 0),
        "BULK_STARTS_FILE": str(starts),
    }
    command = [
        str(OUTBOX), "--app", "benchmarks.bulk_app:app", "--database-url", url,
        "--log-level", "warning", "work", "--processes", str(args.processes),
        "--distribute-every", "0.2", "--no-listen",
    ]  # fmt: skip
    engine = create_engine(url)
    started = time.perf_counter()
    worker = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    try:
        while True:
            with engine.connect() as conn:
                if not conn.execute(select(func.count()).select_from(BulkEvent)).scalar():
                    return time.perf_counter() - started
            if worker.poll() is not None:
                raise RuntimeError(f"outbox work exited with {worker.returncode}")
            time.sleep(POLL_SECONDS)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(60)
        engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--api-calls-per-second", type=float, default=10.0)
    parser.add_argument("--limit-fraction", type=float, default=1.0)
    parser.add_argument("--spacing", type=int, default=None, help="the limit's burst")
    parser.add_argument("--accounts", type=int, default=0)
    parser.add_argument("--account-calls-per-second", type=int, default=3)
    parser.add_argument("--name", default="drain_rate_limited", help="the results file's name")
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    url = scratch_database(DATABASE)
    calls = math.ceil(args.events / args.batch_size)
    minimum = calls / args.api_calls_per_second
    if args.accounts:
        per_account = math.ceil(args.events / args.accounts / args.batch_size)
        minimum = max(minimum, per_account / args.account_calls_per_second)
    runs = []
    for run in range(1, args.runs + 1):
        prepare(url, args.events, args.accounts)
        with FakeMarketingAPIProcess(
            rate_limit=int(args.api_calls_per_second), max_records=args.batch_size
        ) as api:
            starts = Path(tempfile.mkdtemp()) / "starts.log"
            seconds = drain(url, api, args, starts)
            at_entry = most_in_a_second([float(line) for line in starts.read_text().split()])
            seen = api.calls
            most = api.most_calls_in_a_second()
            received = len(api.received)
        refused = sum(call.status == 429 for call in seen)
        runs.append(
            {
                "seconds": round(seconds, 2),
                "ratio": round(minimum / seconds, 3),
                "calls": len(seen),
                "refused_429": refused,
                "most_calls_in_a_second": most,
                "most_calls_in_a_second_at_entry": at_entry,
                "records_received": received,
            }
        )
        print(f"run {run}: {seconds:.2f} s, {minimum / seconds:.3f} of the minimum, "
              f"{refused} calls refused, at most {most} calls in a second "
              f"at the API, {at_entry} at the handler's entry")  # fmt: skip
        if received != args.events:
            raise RuntimeError(f"the API received {received} of {args.events} records")
    result = {
        "benchmark": "drain_rate_limited",
        "command": command_line("benchmarks.drain_rate_limited", args),
        "machine": machine(),
        "events": args.events,
        "batch_size": args.batch_size,
        "api_calls_per_second": args.api_calls_per_second,
        "limit_fraction": args.limit_fraction,
        "processes": args.processes,
        "burst": args.spacing,
        "accounts": args.accounts,
        "account_calls_per_second": args.account_calls_per_second if args.accounts else None,
        "minimum_seconds": round(minimum, 2),
        "runs": runs,
        "median_ratio": statistics.median(r["ratio"] for r in runs),
    }
    print(result)
    print(f"results in {write(args.name, result)}")


if __name__ == "__main__":
    main()
