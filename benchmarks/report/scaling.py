"""Desired workers: what the read costs with millions of events waiting, and what following it
costs a fleet against following the row count."""

from __future__ import annotations

from benchmarks.report._format import Rendered, Results, Target, table, target_table
from benchmarks.report.targets import SCALING_READ_MS


def scaling_read(results: Results) -> Rendered:
    """The read's p50, p95 and max from Python and the server's planning and execution, with
    the index vacuumed and with dead entries at its start; the target at 10,000,000."""
    data = results.data
    lines = [
        f"{data['waiting_rows']:,} events waiting unclaimed behind {data['claimed_groups']:,} "
        f"claimed groups of 100 (their batch jobs a third leased, a third backing off, a third "
        f"due) and a week of throughput minutes, on PostgreSQL, loaded in "
        f"{data['load_seconds']} s; `read_scaling` of two handlers (the bench buffer's and an "
        "empty one's), one statement, in autocommit. Milliseconds:",
        "",
    ]
    cases = {
        "index vacuumed": data["vacuumed"],
        f"{data['handled_rows_not_vacuumed']:,} oldest deleted, not vacuumed": data[
            "dead_index_entries"
        ],
    }
    lines += table(
        ["index", "p50", "p95", "max", "server: planning", "server: execution", "statements"],
        [
            [
                name,
                f"{c['p50_ms']:.2f}",
                f"{c['p95_ms']:.2f}",
                f"{c['max_ms']:.2f}",
                f"{c['server']['planning_ms_p50']:.2f}",
                f"{c['server']['execution_ms_p50']:.2f}",
                str(c["statements_per_read"]),
            ]
            for name, c in cases.items()
        ],
    )
    lines += [
        "p50, p95 and max: the whole call from Python (pool, statement, the arithmetic); the "
        "server's figures: medians of EXPLAIN ANALYZE of the same statement.",
        "",
    ]
    targets = []
    if data["waiting_rows"] >= 10_000_000:
        vacuumed = data["vacuumed"]
        server = vacuumed["server"]["planning_ms_p50"] + vacuumed["server"]["execution_ms_p50"]
        targets.append(
            Target(
                "scaling_read",
                f"the read with 10,000,000 events waiting, p50 ≤ {SCALING_READ_MS:g} ms",
                f"{vacuumed['p50_ms']:.2f} ms (server: {server:.2f} ms)",
                vacuumed["p50_ms"] <= SCALING_READ_MS,
            )
        )
        lines += target_table(targets)
    return lines, targets


def autoscaling(results: Results) -> Rendered:
    """Worker-seconds, peak and promises of both policies in each scenario."""
    data = results.data
    lines = [
        f"One slot handles {data['rate_per_slot']:,.0f} events/s (measured by a real drain: a "
        "burst worker of one slot, the handler sleeping a batch's latency). The row-count "
        f"scaler's target: {data['rows_per_worker']:,} rows a worker, the largest of a doubling "
        "series that keeps every promise in every scenario.",
        "",
    ]
    rows = []
    for name, scenario in data["scenarios"].items():
        for policy in scenario["policies"]:
            rows.append(
                [
                    name,
                    policy["policy"],
                    f"{policy['worker_seconds']:,}",
                    str(policy["peak_workers"]),
                    "yes" if policy["promises_kept"] else "**no**",
                    ", ".join(f"{h} {v:.2f}" for h, v in policy["staleness"].items()),
                ]
            )
        rows.append(
            [name, "desired / row count", f"{scenario['worker_seconds_ratio']:.3f}", "", "", ""]
        )
    lines += table(
        [
            "scenario",
            "policy",
            "worker-seconds",
            "peak workers",
            "promises kept",
            "highest wait / promise",
        ],
        rows,
    )
    return lines, []
