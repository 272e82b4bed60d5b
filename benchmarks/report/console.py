"""The operators' console on big tables: each page's and endpoint's p50 and p95, and what N
viewers cost the database."""

from __future__ import annotations

from benchmarks.report._format import Rendered, Results, Target, table, target_table
from benchmarks.report.targets import (
    CONSOLE_P95_MS,
    CONSOLE_READS_PER_PERIOD,
    INGEST_EVENTS_PER_SECOND,
)


def console_big_tables(results: Results) -> Rendered:
    """The timings table, the viewers' figures, and the two targets."""
    data = results.data
    lines = [
        f"{data['buffer_rows']:,} buffer rows ({data['claimed_groups']:,} groups claimed) and "
        f"{data['archived_rows']:,} archived rows ({data['dead_groups']:,} dead groups of 10) "
        f"on PostgreSQL, loaded in {data['load_seconds']} s; the console served by uvicorn on "
        "loopback, each path asked in turn by one client. Milliseconds of the whole answer:",
        "",
    ]
    timings = data["timings"]
    lines += table(
        ["page or endpoint", "p50 ms", "p95 ms", "max ms"],
        [
            [name, f"{t['p50_ms']:,.1f}", f"{t['p95_ms']:,.1f}", f"{t['max_ms']:,.1f}"]
            for name, t in timings.items()
        ],
    )
    viewers = data["viewers"]
    lines += [
        f"{viewers['viewers']} viewers polling the overview and the status endpoint for "
        f"{viewers['periods']} refresh periods of {viewers['refresh_seconds']:g} s: "
        f"{viewers['answers']:,} answers, {viewers['status_reads']} status reads "
        f"({viewers['status_reads_per_period']} per period), {viewers['statements']:,} "
        "statements in all.",
        "",
    ]
    worst = max(t["p95_ms"] for t in timings.values())
    slowest = max(timings, key=lambda name: timings[name]["p95_ms"])
    targets = [
        Target(
            "console_big_tables",
            f"every page and endpoint p95 ≤ {CONSOLE_P95_MS:g} ms",
            f"{worst:,.1f} ms ({slowest})",
            worst <= CONSOLE_P95_MS,
        ),
        Target(
            "console_big_tables",
            f"status reads per refresh period, whatever the viewers ≤ {CONSOLE_READS_PER_PERIOD:g}",
            f"{viewers['status_reads_per_period']} ({viewers['viewers']} viewers)",
            viewers["status_reads_per_period"] <= CONSOLE_READS_PER_PERIOD,
        ),
    ]
    lines += target_table(targets)
    return lines, targets


def ingest_http(results: Results) -> Rendered:
    """Each run's rate and what the buffer held after it; the rate and exactness targets."""
    data = results.data
    runs = data["runs"]
    lines = [
        "Events written through `POST /api/v1/handlers/{handler}/events` into PostgreSQL by "
        "concurrent producers that send some batches twice, one uvicorn process serving; "
        "unique events per second from the first request to the last answer:",
        "",
    ]
    lines += table(
        ["run", "events", "requests", "seconds", "events/s", "in the buffer", "lost", "twice"],
        [
            [
                str(n + 1),
                f"{r['events']:,}",
                f"{r['requests']:,}",
                f"{r['seconds']:,.2f}",
                f"{r['events_per_second']:,.0f}",
                f"{r['buffer_rows']:,}",
                f"{r['lost']:,}",
                f"{r['buffer_rows'] - r['keys']:,}",
            ]
            for n, r in enumerate(runs)
        ],
    )
    rate = data["median_events_per_second"]
    targets = [
        Target(
            "ingest_http",
            f"≥ {INGEST_EVENTS_PER_SECOND:,.0f} events/s from one process (median of the runs)",
            f"{rate:,.0f}",
            rate >= INGEST_EVENTS_PER_SECOND,
        ),
        Target(
            "ingest_http",
            "retrying producers: nothing lost, nothing written twice",
            f"{data['lost']} lost, {data['duplicated']} twice",
            data["lost"] == 0 and data["duplicated"] == 0,
        ),
    ]
    lines += target_table(targets)
    return lines, targets
