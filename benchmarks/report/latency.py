"""Wake-up latency: from an event's commit to its handler, with notifications and with polling."""

from __future__ import annotations

from benchmarks.report._format import (
    DASH,
    Rendered,
    Results,
    Target,
    count,
    few_runs,
    median,
    spread,
    table,
)
from benchmarks.report.commands import documented_commands, unique
from benchmarks.report.targets import LATENCY_MODES, LATENCY_RATE

LATENCY_MODE_NAMES = {"notify": "`notify` (LISTEN/NOTIFY)", "polling": "`polling` only"}


def latency_rate(results: Results) -> float:
    """The target rate of a latency file, events per second."""
    return float(results.data["rate_per_second"])


def ms(value: float) -> str:
    """Milliseconds, to a tenth."""
    return f"{value:,.1f}"


def latency_target(files: list[Results]) -> Target:
    """The latency measurement asked for: p50 and p99 at 1,000 events/s, in both modes.

    No threshold is set for latency: the target is the measurement itself, met when both
    modes were measured at the full rate (no run of theirs committed short of it).
    """
    goal = (
        f"commit-to-handler start p50 and p99 at {count(LATENCY_RATE)} events/s, REALTIME "
        "handler, with LISTEN/NOTIFY and with polling only: measured (no threshold)"
    )
    found = [r for r in files if latency_rate(r) == LATENCY_RATE]
    if not found:
        return Target("wakeup_latency", goal, DASH, None)
    runs = found[-1].data["runs"]
    figures = [
        f"{mode} p50 {ms(median(r['p50_ms'] for r in runs[mode]))} ms, "
        f"p99 {ms(median(r['p99_ms'] for r in runs[mode]))} ms"
        + (" (rate short)" if any(r.get("rate_short") for r in runs[mode]) else "")
        if runs.get(mode)
        else f"{mode} not measured"
        for mode in LATENCY_MODES
    ]
    complete = all(runs.get(mode) for mode in LATENCY_MODES)
    short = any(r.get("rate_short") for mode in LATENCY_MODES for r in runs.get(mode, []))
    return Target("wakeup_latency", goal, "; ".join(figures), complete and not short)


def wakeup_latency_group(files: list[Results]) -> Rendered:
    """What the latency section says before its files: the measurement the target asks for."""
    target = latency_target(files)
    if target.met is not None:
        return [], [target]
    documented = [c for c in documented_commands("wakeup_latency") if "--rate 1000" in c]
    command = (
        documented[0]
        if documented
        else f"python -m benchmarks.wakeup_latency --rate {count(LATENCY_RATE)}"
    )
    lines = [
        f"The latency target asks for p50 and p99 at {count(LATENCY_RATE)} events/s, with "
        "LISTEN/NOTIFY and with polling only; these results do not hold that measurement yet:",
        "",
        "```sh",
        command,
        "```",
        "",
    ]
    return lines, [target]


def wakeup_latency(results: Results) -> Rendered:
    """Latency percentiles per mode at one rate; 1,000 events/s is the target measurement."""
    data = results.data
    rate = latency_rate(results)
    producers = data.get("producers", 1)
    runs = data["runs"]
    intro = (
        f"{rate:,g} events/s for {data['seconds']:g} s "
        f"({producers} producer{'s' * (producers > 1)}"
        f"{', plain psycopg' if data.get('plain_producers') else ''}), poll interval "
        f"{data.get('poll_interval', '?')} s; milliseconds from commit to handler start, "
        f"medians of the runs' percentiles, spread min{DASH}max."
    )
    if rate == LATENCY_RATE:
        intro += (
            " This is the measurement the latency target asks for: events committed steadily, "
            "a REALTIME handler, with LISTEN/NOTIFY and with polling only (no threshold is set)."
        )
    else:
        intro += " No target is set at this rate."
    lines = [intro, "", *few_runs(min(len(r) for r in runs.values()))]
    if data.get("note"):
        lines += [f"Note: {data['note']}.", ""]
    # Producers and the committed rate are recorded by newer results only (per run, and the
    # producers for the whole file too): a column each when any run has them.
    with_producers = any("producers" in r for mode in runs.values() for r in mode)
    with_rate = any("achieved_rate" in r for mode in runs.values() for r in mode)
    body = []
    short = False
    for mode, mode_runs in runs.items():
        achieved = [float(r["achieved_rate"]) for r in mode_runs if "achieved_rate" in r]
        mode_short = any(r.get("rate_short") for r in mode_runs)
        short = short or mode_short
        cells = [LATENCY_MODE_NAMES.get(mode, f"`{mode}`"), str(len(mode_runs))]
        if with_producers:
            cells.append(unique(r.get("producers", producers) for r in mode_runs))
        cells += [
            ms(median(r["p50_ms"] for r in mode_runs)),
            spread((r["p50_ms"] for r in mode_runs), ms),
            ms(median(r["p99_ms"] for r in mode_runs)),
            spread((r["p99_ms"] for r in mode_runs), ms),
            ms(max(r["max_ms"] for r in mode_runs)),
        ]
        if with_rate:
            committed = DASH
            if achieved:
                committed = ms(median(achieved))
                if min(achieved) != max(achieved):
                    committed += f" ({spread(achieved, ms)})"
                committed += ", short" if mode_short else ""
            cells.append(committed)
        body.append(cells)
    header = ["mode", "runs"]
    header += ["producers"] if with_producers else []
    header += ["p50", "p50 spread", "p99", "p99 spread", "max"]
    header += ["committed/s (spread)"] if with_rate else []
    lines += table(header, body)
    if short:
        lines += [
            f"short: some runs committed more than 5% below the target rate of {rate:,g}/s; "
            "their latencies were measured under a lighter load.",
            "",
        ]
    return lines, []
