"""Drain throughput, on PostgreSQL (with its variants) and on MariaDB."""

from __future__ import annotations

import statistics
from typing import Any

from benchmarks.report._format import (
    DASH,
    Rendered,
    Results,
    Target,
    count,
    few_runs,
    spread,
    table,
    verdict,
)
from benchmarks.report.targets import DRAIN_RATIO, DRAIN_TARGET_BATCH


def archived(results: Results) -> bool:
    """Whether drain results come from an ``--archive`` run.

    The file says so in ``archive``; its name (``drain_throughput_archive.json``) is the
    fallback, so that an archive run is never judged, or drawn, as a plain one.
    """
    return bool(results.data.get("archive", results.path.stem.endswith("_archive")))


# The bench app's claim jobs; a drain run with another ``--max-batches`` is a tuning experiment:
# shown in its own table, neither judged nor drawn.
BENCH_MAX_BATCHES = 64


def tuned(results: Results) -> bool:
    """Whether drain results come from a variant run: non-default claim jobs
    (``--max-batches``), separate ``outbox work`` commands (``--separate-commands``), a raw
    loop that claims by address (``--raw-by-address``), the typed buffer (``--typed``) or no
    ``outbox distribute`` beside the workers (``--without-distribute``)."""
    other_claim_jobs = int(results.data.get("max_batches", BENCH_MAX_BATCHES)) != BENCH_MAX_BATCHES
    return (
        other_claim_jobs
        or bool(results.data.get("separate_commands"))
        or by_address(results)
        or typed(results) is not None
        or not distributed(results)
    )


def distributed(results: Results) -> bool:
    """Whether ``outbox distribute`` ran beside the workers (results from before the option
    existed all did)."""
    return bool(results.data.get("distribute", True))


def typed(results: Results) -> str | None:
    """How the handler of a typed-buffer drain (``--typed``) read its events: ``events`` or
    ``rows``; None for the plain buffer."""
    read = results.data.get("typed")
    return None if read is None else str(read)


def judged_typed(results: Results) -> bool:
    """Whether drain results are the typed target's measurement: the handler reading
    ``batch.events``, separate ``outbox work --burst`` commands alone (the target names no
    ``outbox distribute``), and nothing else changed."""
    return (
        typed(results) == "events"
        and bool(results.data.get("separate_commands"))
        and not distributed(results)
        and int(results.data.get("max_batches", BENCH_MAX_BATCHES)) == BENCH_MAX_BATCHES
        and not by_address(results)
        and not archived(results)
    )


def by_address(results: Results) -> bool:
    """Whether the raw loop of drain results claimed in outbox's form (``--raw-by-address``)."""
    return results.data.get("raw_claim") == "by_address"


def drain_cpu(rows: list[dict[str, Any]], data: dict[str, Any]) -> list[str]:
    """CPU seconds per drain (medians of the runs): the measured processes and PostgreSQL's
    backends; nothing for results from before the drain measured it."""
    if not all(row.get("outbox_cpu") for row in rows):
        return []

    def median_of(runs: list[list[float | None]], index: int) -> float | None:
        values = [run[index] for run in runs if run[index] is not None]
        return statistics.median(values) if values else None

    def seconds(value: float | None) -> str:
        return DASH if value is None else f"{value:.2f}"

    body = []
    for row in rows:
        raw = [median_of(row["raw_cpu"], i) for i in (0, 1)]
        ours = [median_of(row["outbox_cpu"], i) for i in (0, 1)]
        known = [v for v in (*raw, *ours) if v is not None]
        total = f"{(known[2] + known[3]) / (known[0] + known[1]):.2f}" if len(known) == 4 else DASH
        body.append(
            [
                count(row.get("batch_size", data.get("batch_size"))),
                str(row["processes"]),
                *(seconds(v) for v in (*raw, *ours)),
                total,
            ]
        )
    header = [
        "batch size",
        "processes",
        "raw: processes",
        "raw: PostgreSQL",
        "outbox: processes",
        "outbox: PostgreSQL",
        "outbox / raw",
    ]
    return [
        "CPU seconds per drain, medians of the runs: the measured processes (start-up "
        "included) and PostgreSQL's backends (its postmaster's children times; a dash where "
        "the server is not on this machine). On two cores, a drain whose CPU seconds come "
        "near twice its wall time kept both cores busy: it was bound by the CPU.",
        "",
        *table(header, body),
    ]


def drain_throughput(results: Results) -> Rendered:
    """Rates per batch size and process count; the ratio target judged at batch 1,000.

    Results from before the batch-size sweep carry one ``batch_size`` for the whole file rather
    than one per row; both are read. The plain drain's target is judged for 1 and 2 processes,
    as it was set; an ``--archive`` run's for each process count it measured, against the raw
    loop that archives too.
    """
    data = results.data
    archive = archived(results)
    name = "drain_throughput (archive)" if archive else "drain_throughput"
    read = typed(results)
    if read is not None:
        name = f"drain_throughput (typed, batch.{read})"
    if read == "json":
        name = "drain_throughput (JSON, batch.events)"
    rows = sorted(
        data["rows"], key=lambda r: (r.get("batch_size", data.get("batch_size", 0)), r["processes"])
    )
    runs = max(len(row["outbox_rates"]) for row in rows)
    lines = [
        f"{data['events']:,} events, {data.get('worker_threads', '?')} threads per worker, "
        f"{data.get('max_batches', BENCH_MAX_BATCHES)} claim jobs (`max_batches`), "
        f"{'archiving every row' if archive else 'no archive'}"
        + (
            "; the JSON buffer (a document of about 150 bytes per event), its handler reading a "
            "value of every event's document through `batch.events`, the raw loop the same value "
            "from psycopg's tuples"
            if read == "json"
            else f"; the typed buffer (an Enum, JSON, a DateTime with time zone, a Numeric and a "
            f"String), its handler reading every value of every event through `batch.{read}`, "
            "the raw loop the same values from psycopg's tuples"
            if read is not None
            else ""
        )
        + (
            "; no `outbox distribute` beside the workers, which distribute by themselves"
            if not distributed(results)
            else ""
        )
        + f"; events/s, medians of the runs, "
        f"spread min{DASH}max; process start-up included. The ratio is outbox over the raw loop"
        f"{' (which archives every row too)' if archive else ''}"
        f"{', which claims as outbox does, by address' if by_address(results) else ''}.",
        "",
        *few_runs(runs),
    ]
    body = []
    for row in rows:
        batch = row.get("batch_size", data.get("batch_size"))
        body.append(
            [
                count(batch),
                str(row["processes"]),
                str(len(row["outbox_rates"])),
                count(row["raw_median"]),
                spread(row["raw_rates"]),
                count(row["outbox_median"]),
                spread(row["outbox_rates"]),
                f"{row['ratio']:.2f}",
                verdict(row["ratio"] >= DRAIN_RATIO),
            ]
        )
    header = [
        "batch size",
        "processes",
        "runs",
        "raw loop",
        "raw spread",
        "outbox",
        "outbox spread",
        "ratio",
        f"ratio ≥ {DRAIN_RATIO}",
    ]
    lines += table(header, body)
    lines += drain_cpu(rows, data)
    if judged_typed(results):
        return lines, typed_targets(name, rows, data)
    if tuned(results):
        return lines, []
    # The target was set at one batch size; the others are judged in the table only. Results
    # without that size are judged at every size they have.
    at_target = [
        r for r in rows if r.get("batch_size", data.get("batch_size")) == DRAIN_TARGET_BATCH
    ] or rows
    targets = []
    if archive:
        counts = sorted({int(r["processes"]) for r in at_target})
        goal = f"archive: outbox / raw archiving loop ≥ {DRAIN_RATIO}"
    else:
        counts = [1, 2]
        goal = f"outbox / raw loop ≥ {DRAIN_RATIO}"
    for processes in counts:
        chosen = [r for r in at_target if r["processes"] == processes]
        figure = ", ".join(
            f"{r['ratio']:.2f} (batch {count(r.get('batch_size', data.get('batch_size')))})"
            for r in chosen
        )
        targets.append(
            Target(
                name,
                f"{goal}, {processes} process{'es' * (processes > 1)}",
                figure or DASH,
                all(r["ratio"] >= DRAIN_RATIO for r in chosen) if chosen else None,
            )
        )
    return lines, targets


def typed_targets(name: str, rows: list[dict[str, Any]], data: dict[str, Any]) -> list[Target]:
    """The typed buffer's target: outbox / raw loop at batch 1,000, with 1 and 2 separate
    ``outbox work`` commands, the handler reading ``batch.events``."""
    targets = []
    for processes in (1, 2):
        chosen = [
            r
            for r in rows
            if r["processes"] == processes
            and r.get("batch_size", data.get("batch_size")) == DRAIN_TARGET_BATCH
        ]
        targets.append(
            Target(
                name,
                f"typed buffer, batch.events: outbox / raw loop ≥ {DRAIN_RATIO}, {processes} "
                f"separate command{'s' * (processes > 1)} (batch {count(DRAIN_TARGET_BATCH)})",
                ", ".join(f"{r['ratio']:.2f}" for r in chosen) or DASH,
                all(r["ratio"] >= DRAIN_RATIO for r in chosen) if chosen else None,
            )
        )
    return targets


def drain_mariadb(results: Results) -> Rendered:
    """outbox against the raw PyMySQL loop on MariaDB: shown beside its loop, no target."""
    data = results.data
    lines = [
        f"{data['events']:,} events on {data.get('server', 'MariaDB')}, batch "
        f"{count(data['batch_size'])}, {data.get('worker_threads', '?')} threads per worker, "
        "no-op handler; `outbox distribute` and P separate `outbox work --burst` commands "
        "against P raw loops (`SELECT ... FOR UPDATE SKIP LOCKED`, `UPDATE` by id, read the "
        "group, delete it); events/s, medians of the runs, spread min" + DASH + "max; process "
        "start-up included.",
        "",
    ]
    lines += few_runs(int(data.get("runs", 0)))
    body = [
        [
            str(row["processes"]),
            count(row["raw_median"]),
            spread(row["raw_rates"]),
            count(row["outbox_median"]),
            spread(row["outbox_rates"]),
            f"{row['ratio']:.2f}",
        ]
        for row in data["rows"]
    ]
    header = ["processes", "raw loop", "raw spread", "outbox", "outbox spread", "ratio"]
    lines += table(header, body)

    def cpu(runs: list[list[float | None]], index: int) -> str:
        values = [value for run in runs if (value := run[index]) is not None]
        return f"{statistics.median(values):.2f}" if values else DASH

    lines += [
        "CPU seconds per drain, medians of the runs: the measured processes and the MariaDB "
        "server process (`mariadbd`, from `/proc`; a dash where it is not on this machine).",
        "",
    ]
    lines += table(
        ["processes", "raw: processes", "raw: MariaDB", "outbox: processes", "outbox: MariaDB"],
        [
            [
                str(row["processes"]),
                cpu(row["raw_cpu"], 0),
                cpu(row["raw_cpu"], 1),
                cpu(row["outbox_cpu"], 0),
                cpu(row["outbox_cpu"], 1),
            ]
            for row in data["rows"]
        ],
    )
    return lines, []
