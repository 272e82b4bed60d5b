"""Memory and bloat: a worker's resident set, the buffer's size, the collector, autovacuum."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from benchmarks.report._format import (
    DASH,
    TIMES,
    Rendered,
    Results,
    Target,
    count,
    few_runs,
    median,
    size,
    spread,
    table,
    target_table,
)
from benchmarks.report.targets import VACUUMED_OVER_EMPTY, WORKER_RSS_MB

# The buffer's states, in the order the benchmark goes through them.
BUFFER_STATES = {
    "empty": "empty",
    "loaded": "loaded",
    "drained": "drained",
    "vacuumed": "drained + VACUUM",
    "reindexed": "drained + VACUUM + `outbox reindex`",
}


def over_empty(data: dict[str, Any], state: str) -> float | None:
    """The buffer's total size in ``state`` over the empty buffer's; None if not measured.

    The ratio the benchmark recorded (``<state>_over_empty``) is the one judged; results that
    lack it but have the sizes get it computed from them.
    """
    recorded = data.get(f"{state}_over_empty")
    if recorded is not None:
        return float(recorded)
    sizes = data["sizes"]
    if state not in sizes:
        return None
    return float(sizes[state]["total_bytes"] / sizes["empty"]["total_bytes"])


def memory_bloat(results: Results) -> Rendered:
    """The worker's peak memory and the buffer's size through a drain, VACUUM and REINDEX."""
    data = results.data
    rss_mib = data["worker_peak_rss_mib"]
    rss_mb = rss_mib * 2**20 / 1e6
    runs = data.get("runs", [])

    def spread_of(key: str) -> str:
        return spread([run[key] for run in runs], lambda value: f"{value:g}")

    if runs:
        lines = [
            f"One `outbox work --burst --concurrency 4` process drained {data['events']:,} events "
            f"in {data['drain_seconds']:g} s ({spread_of('drain_seconds')}), with a peak resident "
            f"set of {rss_mib:g} MiB ({spread_of('worker_peak_rss_mib')}); `outbox reindex` then "
            f"took {data['reindex_seconds']:g} s ({spread_of('reindex_seconds')}). Medians of "
            f"{len(runs)} runs, each on fresh tables (spread min{DASH}max); the sizes below are "
            "medians too.",
            "",
            *few_runs(len(runs)),
        ]
    else:
        lines = [
            f"One `outbox work --burst --concurrency 4` process drained {data['events']:,} events "
            f"in {data['drain_seconds']} s (one run: the results keep no spread).",
            "",
        ]
    sizes = data["sizes"]
    body = [
        [
            label,
            size(sizes[state]["heap_bytes"]),
            size(sizes[state]["index_bytes"]),
            size(sizes[state]["total_bytes"]),
            f"{ratio:,.1f}{TIMES}" if (ratio := over_empty(data, state)) is not None else DASH,
        ]
        for state, label in BUFFER_STATES.items()
        if state in sizes
    ]
    lines += table(["buffer", "heap", "indexes", "total", "total / empty"], body)
    targets = [
        Target(
            "memory_bloat",
            f"worker peak RSS ≤ {WORKER_RSS_MB:g} MB",
            f"{rss_mib:g} MiB ({rss_mb:.1f} MB)",
            rss_mb <= WORKER_RSS_MB,
        )
    ]
    # VACUUM returns the emptied heap but not the emptied index pages; `outbox reindex` returns
    # them too. Both are judged: the first is what a buffer gets by itself, the second what it
    # gets from the nightly rebuild the docs recommend.
    for state, what in (("vacuumed", "VACUUM"), ("reindexed", "VACUUM + `outbox reindex`")):
        ratio = over_empty(data, state)
        targets.append(
            Target(
                "memory_bloat",
                f"buffer after drain + {what} ≤ {VACUUMED_OVER_EMPTY:g}{TIMES} empty",
                DASH if ratio is None else f"{ratio:,.1f}{TIMES}",
                None if ratio is None else ratio <= VACUUMED_OVER_EMPTY,
            )
        )
    lines += target_table(targets)
    return lines, targets


def mib(value: float) -> str:
    """Bytes in MiB, to a tenth: the autovacuum table's sizes, compared down a column."""
    return f"{value / 2**20:,.1f}"


def sequential_probes(row: dict[str, Any]) -> str:
    """How many of a variant's probes the planner ran as a sequential scan, of how many.

    Read from the plan shapes' counts (``probe_plans``), or from the samples' own shapes if
    only they are kept; a dash when the results record no plan shape.
    """
    plans: dict[str, int] | None = row.get("probe_plans")
    if plans is None:
        shapes = [s["probe_plan"] for s in row.get("samples", []) if "probe_plan" in s]
        if not shapes:
            return DASH
        plans = {shape: shapes.count(shape) for shape in set(shapes)}
    total = sum(plans.values())
    sequential = sum(n for shape, n in plans.items() if "Seq Scan" in shape)
    return f"{sequential} of {total}"


def autovacuum(results: Results) -> Rendered:
    """Each variant's autovacuum runs, dead tuples, sizes and probe times; no target is set.

    One row per variant: the median of its runs, with the spread under it where there are
    several (older results hold one run per variant). The samples the results keep (one every
    ``--sample-every`` seconds) are not shown.
    """
    data = results.data
    variants: dict[str, list[dict[str, Any]]] = {}
    for row in data["rows"]:
        variants.setdefault(row["variant"], []).append(row)
    runs = max(len(rows) for rows in variants.values())
    kept = (
        f"Medians of {runs} runs per variant, lowest to highest in brackets"
        if runs > 1
        else "One run per variant (the results keep its samples, not a spread)"
    )
    lines = [
        f"{data['rate']:,g} events/s in transactions of {data['rows_per_transaction']} rows, "
        f"{data['seconds_per_variant']:g} s per variant, sampled every "
        f"{data['sample_every_s']:g} s; worker: `{data['worker']}`. {kept}. The probe is the "
        "claim's pick (`SELECT id ... WHERE group_id IS NULL ORDER BY id LIMIT 1000`), timed "
        "with EXPLAIN ANALYZE at each sample; the planner may pick a sequential scan and a sort "
        "rather than the partial index once an analyze has seen the buffer small. No target is "
        "set: the settings to recommend for buffer tables are measured here.",
        "",
    ]
    if "load_average_at_start" in data:
        load = ", ".join(f"{v:g}" for v in data["load_average_at_start"])
        lines += [f"Load average at the start: {load}.", ""]

    def cell(rows: list[dict[str, Any]], key: str, fmt: Callable[[float], str]) -> str:
        values = [float(row[key]) for row in rows]
        text = fmt(median(values))
        return f"{text} ({spread(values, fmt)})" if len(values) > 1 else text

    def ms(value: float) -> str:
        return f"{value:.2f}"

    body = [
        [
            f"`{name}`",
            f"{rows[0]['naptime_s']} s",
            str(len(rows)),
            cell(rows, "events_per_s", count)
            + (" (short)" if any(row.get("rate_short") for row in rows) else ""),
            cell(rows, "autovacuum_runs", count),
            cell(rows, "dead_tuples_max", count),
            cell(rows, "dead_tuples_final", count),
            cell(rows, "heap_bytes_final", mib),
            cell(rows, "index_bytes_final", mib),
            cell(rows, "probe_ms_p50", ms),
            cell(rows, "probe_ms_max", ms),
            ", ".join(sequential_probes(row) for row in rows),
            cell(rows, "backlog_at_end", count),
        ]
        for name, rows in variants.items()
    ]
    header = ["variant", "naptime", "runs", "events/s", "autovacuums", "dead tuples max",
              "dead tuples at end", "heap at end (MiB)", "indexes at end (MiB)", "probe p50 (ms)",
              "probe max (ms)", "probes by seq scan", "backlog at end"]  # fmt: skip
    lines += table(header, body)
    if any(row.get("rate_short") for row in data["rows"]):
        lines += ["(short): the producer fell more than 5% below the target rate.", ""]
    # Variants that share their per-table settings (the same ``tuned-N`` at two naptimes)
    # share one line.
    tuned: dict[str, list[str]] = {}
    for name, rows in variants.items():
        if rows[0].get("table_options"):
            options = ", ".join(f"`{k} = {v}`" for k, v in rows[0]["table_options"].items())
            tuned.setdefault(options, []).append(f"`{name}`")
    if tuned:
        lines += ["Per-table settings of the tuned variants (`ALTER TABLE ... SET`):", ""]
        lines += table(["variants", "settings"], [[", ".join(v), k] for k, v in tuned.items()])
    settings = data.get("server_settings_before")
    if settings:
        lines += [
            "<details><summary>Server settings before the run</summary>",
            "",
            *table(["setting", "value"], [[f"`{k}`", str(v)] for k, v in settings.items()]),
            "</details>",
            "",
        ]
    return lines, []


def gc_settle(results: Results) -> Rendered:
    """The collector with Python's defaults and with the ``outbox`` command's; no target."""
    data = results.data
    lines = [
        f"A drain of {data['events']:,} events by a `Worker` (four threads) in one process: the "
        "collector's time summed from `gc.callbacks`, and a loaded process's exit (median).",
        "",
    ]
    body = []
    for key, label in (("python_defaults", "Python's defaults"), ("settled", "`settle_heap()`")):
        row = data[key]
        collections = ", ".join(f"{n:,}" for n in row["collections"].values())
        body.append(
            [label, f"{row['collector_seconds']:.3f}", collections, f"{row['exit_seconds']:.3f}"]
        )
    header = ["collector", "collector time (s)", "collections (gen 0, 1, 2)", "exit (s)"]
    return lines + table(header, body), []
