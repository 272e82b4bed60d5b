"""Claims at scale: the count and the claim as the backlog grows, under contention, and what a
claim costs PostgreSQL."""

from __future__ import annotations

from typing import Any

from benchmarks.report._format import (
    DASH,
    TIMES,
    Rendered,
    Results,
    Target,
    count,
    ms_spread,
    table,
    target_table,
    timing,
)
from benchmarks.report.sections import TITLES
from benchmarks.report.targets import CLAIM_GROWTH, SCALE_BASE_ROWS, SCALE_MS, SCALE_ROWS


def scale(results: Results) -> Rendered:
    """The count and the claims at each backlog; their targets at a million rows.

    The count's cap, the claim of 100 rows and the raw loop's claim are recorded by newer
    results only: each gets a column when any row has it.
    """
    data = results.data
    rows = sorted(data["rows"], key=lambda r: r["waiting_rows"])
    with_cap = any("count_cap" in r for r in rows)
    with_claim_100 = any("claim_100_ms" in r for r in rows)
    with_raw = any("raw_claim_ms" in r for r in rows)
    with_returning = any("claim_returning_ms" in r for r in rows)
    # Older results do not record the cap: it was 64,000 rows when they were measured.
    cap = "" if with_cap else " The count is capped at 64,000 rows."
    kept = (
        f"with their spread (min{DASH}max) in brackets"
        if any("spread_ms" in r for r in rows)
        else "(these results keep the medians only, not the spread)"
    )
    lines = [
        f"Milliseconds, each the median of `--repeat` timings {kept}.{cap} The plans of the "
        f"claim of 1,000 rows are in `results/{results.path.name}`.",
        "",
    ]
    header = ["waiting rows"]
    header += ["count cap (rows)"] if with_cap else []
    header += ["capped count (ms)", "claim of 1,000 (ms)"]
    header += ["claim of 100 (ms)"] if with_claim_100 else []
    header += ["claim of 1,000 returning its rows (ms)"] if with_returning else []
    header += ["raw loop's claim of 1,000 (ms)"] if with_raw else []
    body = []
    for r in rows:
        cells = [count(r["waiting_rows"])]
        cells += [count(r["count_cap"]) if "count_cap" in r else DASH] if with_cap else []
        cells += [timing(r, "count_ms"), timing(r, "claim_ms")]
        cells += [timing(r, "claim_100_ms")] if with_claim_100 else []
        cells += [timing(r, "claim_returning_ms")] if with_returning else []
        cells += [timing(r, "raw_claim_ms")] if with_raw else []
        body.append(cells)
    lines += table(header, body)
    if with_raw:
        lines += [
            "The raw loop's claim is the form the drain target names, through plain psycopg: "
            "the locking CTE, then UPDATE ... FROM the CTE joined by id, RETURNING the rows. "
            "outbox's claim locks with the same CTE but updates the rows by the addresses it "
            "locked (`WHERE ctid = ANY (ARRAY(SELECT ctid FROM claimable))`, docs/design.md); "
            "returning its rows, as the worker runs it, it does the raw loop's work and "
            "reads every column through SQLAlchemy. The timings take turns, repeat by repeat; "
            "each repeat claims the same oldest rows and rolls back. What the claim's time is "
            "made of, and how fast any claim that stamps 1,000 rows can be here: the section "
            f'"{TITLES["claim_floor"]}" below.',
            "",
        ]
    by_size = {r["waiting_rows"]: r for r in rows}
    large, base = by_size.get(SCALE_ROWS), by_size.get(SCALE_BASE_ROWS)
    at = f"at {count(SCALE_ROWS)} rows"
    targets = [
        Target(
            "scale",
            f"capped count < {SCALE_MS:g} ms {at}",
            f"{large['count_ms']:.2f} ms" if large else DASH,
            large["count_ms"] < SCALE_MS if large else None,
        ),
        Target(
            "scale",
            f"claim < {SCALE_MS:g} ms {at}",
            f"{large['claim_ms']:.2f} ms" if large else DASH,
            large["claim_ms"] < SCALE_MS if large else None,
        ),
    ]
    if large and base:
        growth = large["claim_ms"] / base["claim_ms"]
        targets.append(
            Target(
                "scale",
                f"claim growth {count(SCALE_BASE_ROWS)} → {count(SCALE_ROWS)} rows "
                f"< {CLAIM_GROWTH}{TIMES}",
                f"{growth:.2f}{TIMES}",
                growth < CLAIM_GROWTH,
            )
        )
    else:
        targets.append(Target("scale", f"claim growth < {CLAIM_GROWTH}{TIMES}", DASH, None))
    lines += target_table(targets)
    return lines, targets


def claim_contention(results: Results) -> Rendered:
    """One claim's time beside rows another claim holds locked; measured, no target."""
    data = results.data
    lines = [
        f"A claim of {data['batch_size']:,} rows from {data['events']:,} waiting, while another "
        "connection holds rows locked by an uncommitted claim; milliseconds, median of the "
        f"repeats. About {data['microseconds_per_held_row']} µs per row held locked.",
        "",
    ]
    body = [[count(row["held"]), f"{row['claim_ms']:.2f}"] for row in data["rows"]]
    return lines + table(["rows held locked", "claim (ms)"], body), []


CLAIM_FLOOR_VARIANTS = {
    "outbox": "outbox's claim on the buffer as outbox creates it",
    "no_row_lock": "without `FOR UPDATE SKIP LOCKED` (unsafe with concurrent claimers)",
    "no_group_index": "without the group index",
    "unclaimed_index_only": "without the group index and the primary key",
    "heap_only": "heap-only updates: fillfactor 50, the primary key the only index",
}


IN_FLIGHT_SCHEMA_LABELS = {
    "outbox": "outbox's (partial index on unclaimed rows, group index)",
    "heap_only": "heap-only (fillfactor 50, the primary key the only index)",
}


def claim_floor(results: Results) -> Rendered:
    """The claim with parts of its writes taken away: shown beside the scale target."""
    data = results.data
    share = data["heap_only_updates"]
    lines = [
        f"One claim of {count(data['batch_size'])} rows from {count(data['waiting_rows'])} "
        f"waiting, stamping them, each variant's schema change rolled back with it; "
        f"milliseconds, median of {data['repeat']} (the variants take turns), and the WAL one "
        f"claim writes. In the heap-only variant, {count(share['heap_only'])} of "
        f"{count(share['updates'])} updates were heap-only.",
        "",
    ]
    body = [
        [
            CLAIM_FLOOR_VARIANTS.get(row["variant"], row["variant"]),
            f"{row['claim_ms']:.2f}",
            f"{row['spread_ms'][0]:.2f}{DASH}{row['spread_ms'][1]:.2f}",
            count(row["wal_records"]),
            count(row["wal_bytes"]),
        ]
        for row in data["rows"]
    ]
    header = ["claim", "ms", "spread (ms)", "WAL records", "WAL bytes"]
    lines += table(header, body)
    within = [
        CLAIM_FLOOR_VARIANTS.get(row["variant"], row["variant"])
        for row in data["rows"]
        if row["claim_ms"] < SCALE_MS
    ]
    batch = count(data["batch_size"])
    lines += [
        f"In this run, the claims of {batch} rows under the scale target's {SCALE_MS:g} ms: "
        + ("; ".join(within) + "." if within else "none, with any of these schemas."),
        "",
    ]
    if "in_flight" in data:
        lines += in_flight_costs(data["in_flight"])
    return lines, []


def in_flight_costs(data: dict[str, Any]) -> list[str]:
    """The claim and the capped count on outbox's schema and on the heap-only copy, with
    nothing in flight and on copies with ``data['groups']`` groups claimed at their head."""
    lines = [
        f"The claim and the distributor's count (capped at {count(data['count_cap'])} rows) on "
        f"outbox's schema and on the heap-only copy, with nothing in flight and on a copy of "
        f"each with {count(data['groups'])} groups ({count(data['rows'])} rows) claimed at its "
        f"head, all vacuumed: milliseconds, medians with the spread (min{DASH}max) in "
        "brackets, the eight timings taking turns.",
        "",
    ]
    body = [
        [
            IN_FLIGHT_SCHEMA_LABELS.get(row["schema"], row["schema"]),
            *(
                ms_spread(row[when][work]["median"], row[when][work]["spread"])
                for work in ("claim_ms", "count_ms")
                for when in ("idle", "in_flight")
            ),
        ]
        for row in data["costs"]
    ]
    header = ["schema", "claim", "claim, in flight", "count", "count, in flight"]
    return lines + table(header, body)
