"""The operators' console on big tables: every page and API answer of the dashboard, with
10,000,000 buffer rows and 1,000,000 archived rows on PostgreSQL.

The buffer holds ``--buffer-rows`` events, of which ``--groups`` groups of 100 are claimed
(their jobs waiting, retrying or in flight); the archive ``--archived-rows``, of which
``--dead-groups`` groups of 10 are dead (the rest succeeded). With ``--ordered`` the handler is
ordered by ``account_id``, which has no index: the search page's ordering-key look is timed on
its bounded path (the groups' events only). The console (``outbox.web``) is
served by uvicorn on loopback, as ``outbox dashboard`` serves it, and each page and endpoint is
asked ``--requests`` times in turn by one client; each figure is its p50 and p95 in
milliseconds, the time of the whole HTTP answer. Then ``--viewers`` clients poll the overview
and the status endpoint together for ``--periods`` refresh periods, and the database
statements the console ran meanwhile are counted: at most one status read per period,
whatever the number of viewers.

    python -m benchmarks.console_big_tables --buffer-rows 10000000 --archived-rows 1000000
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
import uuid
from typing import Any

import httpx
import psycopg
import uvicorn
from sqlalchemy import event

from benchmarks._common import (
    command_line,
    drop_database,
    fresh_tables,
    libpq_url,
    machine,
    percentile,
    scratch_database,
    write,
)
from benchmarks.bench_app import Base, BenchEvent
from outbox import Outbox
from outbox.ops import groups
from outbox.ops.selection import Selection
from outbox.web import Auth, Principal, Role, create_app

TOKEN = "benchmark-token-0123456789"  # noqa: S105 - a loopback benchmark's own viewer
DATABASE = "outbox_bench_console"
TARGET_P95_MS = 300.0


def load(
    dsn: str, buffer_rows: int, claimed_groups: int, archived_rows: int, dead_groups: int
) -> dict[str, uuid.UUID]:
    """Fill the buffer and the archive with generated rows; one live and one dead group's ids."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO bench_events (account_id, kind, created_at) "
            "SELECT n %% 5000, 'page_view', now() - make_interval(secs => %s - n) "
            "FROM generate_series(1, %s) AS n",
            (buffer_rows, buffer_rows),
        )
        # Claimed groups of 100 rows each, with their jobs: a third retrying, a third in
        # flight, the rest waiting.
        conn.execute(
            "UPDATE bench_events SET group_id = "
            "('00000000-0000-0000-0001-' || lpad(to_hex((id - 1) / 100), 12, '0'))::uuid "
            "WHERE id <= %s",
            (claimed_groups * 100,),
        )
        conn.execute(
            "INSERT INTO outbox_jobs (kind, handler, group_id, priority, attempts, "
            "lease_owner, lease_token, lease_expires_at, last_error) "
            "SELECT 'batch', 'bench', "
            "('00000000-0000-0000-0001-' || lpad(to_hex(g), 12, '0'))::uuid, 2, g %% 3, "
            "CASE WHEN g %% 3 = 2 THEN 'bench-worker' END, "
            "CASE WHEN g %% 3 = 2 THEN gen_random_uuid() END, "
            "CASE WHEN g %% 3 = 2 THEN now() + interval '1 hour' END, "
            "CASE WHEN g %% 3 = 1 THEN 'RuntimeError: 503 from the bulk API' END "
            "FROM generate_series(0, %s - 1) AS g",
            (claimed_groups,),
        )
        conn.execute(
            "INSERT INTO outbox_archive (handler, buffer, event_id, group_id, status, attempts, "
            "error, payload, created_at) "
            "SELECT 'bench', 'bench_events', n, "
            "CASE WHEN n <= %s "
            "THEN ('00000000-0000-0000-0002-' || lpad(to_hex((n - 1) / 10), 12, '0'))::uuid "
            "ELSE ('00000000-0000-0000-0003-' || lpad(to_hex((n - 1) / 100), 12, '0'))::uuid "
            "END, "
            "CASE WHEN n <= %s THEN 'dead' ELSE 'succeeded' END, 1, "
            "CASE WHEN n <= %s THEN 'RuntimeError: 422 account ' || (n %% 5000) || ' closed' END, "
            "jsonb_build_object('id', n, 'account_id', n %% 5000, 'kind', 'page_view'), now() "
            "FROM generate_series(1, %s) AS n",
            (dead_groups * 10, dead_groups * 10, dead_groups * 10, archived_rows),
        )
        conn.execute("VACUUM ANALYZE bench_events")
        conn.execute("VACUUM ANALYZE outbox_archive")
        conn.execute("VACUUM ANALYZE outbox_jobs")
    return {
        "live": uuid.UUID("00000000-0000-0000-0001-000000000001"),
        "dead": uuid.UUID("00000000-0000-0000-0002-000000000001"),
    }


def serve(app: Outbox, port: int, refresh: float) -> tuple[uvicorn.Server, threading.Thread, Any]:
    console = create_app(
        app, auth=Auth(tokens={TOKEN: Principal("bench", Role.VIEWER)}), refresh_seconds=refresh
    )
    server = uvicorn.Server(uvicorn.Config(console, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    return server, thread, console


def paths(ids: dict[str, uuid.UUID]) -> dict[str, str]:
    """Each page and endpoint timed, by name."""
    return {
        "page: overview": "/",
        "page: handler": "/handlers/bench",
        "page: groups": "/groups",
        "page: groups, retrying": "/groups?status=retrying",
        "page: dead letters": "/dead",
        "page: dead letters, error search": "/dead?error=account+4242",
        "page: dead letters, payload search": "/dead?payload=%22account_id%22%3A+4242",
        "page: live group": f"/groups/{ids['live']}",
        "page: dead group": f"/groups/{ids['dead']}",
        "page: archive": "/archive",
        "page: search, group id": f"/search?q={ids['live']}",
        "page: search, event id": "/search?q=123456",
        "page: search, ordering key": "/search?q=4242",
        "page: history": "/history",
        "page: workers": "/workers",
        "api: status": "/api/v1/status",
        "api: groups": "/api/v1/groups",
        "api: groups, dead": "/api/v1/groups?status=dead",
        "api: groups, payload search": "/api/v1/groups?payload=%22account_id%22%3A+4242",
        "api: group": f"/api/v1/groups/{ids['dead']}",
        "api: search, ingest key": "/api/v1/search?q=order-17",
        "api: history": "/api/v1/history",
        "api: workers": "/api/v1/workers",
    }


def time_paths(base: str, named: dict[str, str], requests: int) -> dict[str, dict[str, float]]:
    """p50 and p95 milliseconds of each path, asked ``requests`` times in turn."""
    samples: dict[str, list[float]] = {name: [] for name in named}
    headers = {"Authorization": f"Bearer {TOKEN}", "Accept": "text/html"}
    with httpx.Client(base_url=base, headers=headers, timeout=60) as client:
        for name, path in named.items():  # one warm-up each
            response = client.get(path)
            if response.status_code != 200:
                raise RuntimeError(f"{name}: {path} answered {response.status_code}")
        for _ in range(requests):
            for name, path in named.items():
                started = time.perf_counter()
                client.get(path).raise_for_status()
                samples[name].append(1000 * (time.perf_counter() - started))
    return {
        name: {
            "p50_ms": round(statistics.median(values), 1),
            "p95_ms": round(percentile(values, 0.95), 1),
            "max_ms": round(max(values), 1),
        }
        for name, values in samples.items()
    }


def viewers(
    base: str, app: Outbox, console: Any, count: int, periods: int, refresh: float
) -> dict[str, Any]:
    """``count`` clients poll the overview and the status endpoint for ``periods`` refresh
    periods: the status reads and statements the console ran meanwhile."""
    statements = [0]

    def counted(*_: Any) -> None:
        statements[0] += 1

    event.listen(app.engine, "before_cursor_execute", counted)
    reads_before = console.state.console.snapshots.reads
    stop = time.monotonic() + periods * refresh
    answered = [0]

    def poll() -> None:
        headers = {"Authorization": f"Bearer {TOKEN}", "Accept": "text/html"}
        with httpx.Client(base_url=base, headers=headers, timeout=60) as client:
            while time.monotonic() < stop:
                client.get("/").raise_for_status()
                client.get("/api/v1/status").raise_for_status()
                answered[0] += 2
                time.sleep(refresh / 5)

    threads = [threading.Thread(target=poll) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    event.remove(app.engine, "before_cursor_execute", counted)
    reads = console.state.console.snapshots.reads - reads_before
    return {
        "viewers": count,
        "periods": periods,
        "refresh_seconds": refresh,
        "answers": answered[0],
        "status_reads": reads,
        "status_reads_per_period": round(reads / periods, 2),
        "statements": statements[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--buffer-rows", type=int, default=10_000_000)
    parser.add_argument("--groups", type=int, default=1000)
    parser.add_argument("--archived-rows", type=int, default=1_000_000)
    parser.add_argument("--dead-groups", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--viewers", type=int, default=20)
    parser.add_argument("--periods", type=int, default=6)
    parser.add_argument("--refresh", type=float, default=5.0)
    parser.add_argument("--port", type=int, default=28765)
    parser.add_argument("--keep", action="store_true", help="Keep the database afterwards.")
    parser.add_argument(
        "--ordered", action="store_true", help="Order the handler by account_id (no index)."
    )
    args = parser.parse_args()
    url = scratch_database(DATABASE)
    try:
        fresh_tables(url, Base.metadata)
        started = time.monotonic()
        ids = load(
            libpq_url(url), args.buffer_rows, args.groups, args.archived_rows, args.dead_groups
        )
        loaded = time.monotonic() - started
        app = Outbox(url)
        ordering_key = "account_id" if args.ordered else None
        app.handler(BenchEvent, name="bench", batch_size=100, ordering_key=ordering_key)(
            lambda batch: None
        )
        server, thread, console = serve(app, args.port, args.refresh)
        base = f"http://127.0.0.1:{args.port}"
        try:
            timings = time_paths(base, paths(ids), args.requests)
            shared = viewers(base, app, console, args.viewers, args.periods, args.refresh)
        finally:
            server.should_exit = True
            thread.join(10)
        listing = groups.find(app, Selection(statuses=("dead",)), limit=1)
        worst = max(t["p95_ms"] for t in timings.values())
        data = {
            "benchmark": "console_big_tables",
            "command": command_line("benchmarks.console_big_tables", args),
            "machine": machine(),
            "buffer_rows": args.buffer_rows,
            "archived_rows": args.archived_rows,
            "claimed_groups": args.groups,
            "dead_groups": args.dead_groups,
            "dead_groups_counted": listing.total,
            "counts_capped": listing.capped,
            "load_seconds": round(loaded, 1),
            "timings": timings,
            "worst_p95_ms": worst,
            "target_p95_ms": TARGET_P95_MS,
            "viewers": shared,
        }
        path = write("console_big_tables", data)
        for name, figure in timings.items():
            print(f"{name:40} p50 {figure['p50_ms']:8.1f} ms   p95 {figure['p95_ms']:8.1f} ms")
        print(f"worst p95 {worst} ms (target {TARGET_P95_MS}); viewers: {shared}")
        print(f"written to {path}")
    finally:
        if not args.keep:
            drop_database(DATABASE)


if __name__ == "__main__":
    main()
