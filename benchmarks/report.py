"""Results report: ``benchmarks/RESULTS.md`` and a throughput chart from ``benchmarks/results/``.

    .bench-venv/bin/python -m benchmarks.report [--results DIR] [--output FILE]

Reads every JSON file in ``benchmarks/results/`` (or ``--results DIR``) and writes

* ``benchmarks/RESULTS.md`` (or ``--output FILE``): the machine, then one section per
  benchmark with the command that produced its results, its figures (medians, and the spread,
  min to max, where the results keep every run) and the targets set for it, each marked met or
  not met;
* ``throughput.png`` in the results directory: drain rate against batch size, for outbox and
  the raw loop at each process count, with the peers' best rates as reference lines.

The chart needs matplotlib, which is no dependency of the project: run the report with the
benchmarks' own virtualenv (``.bench-venv``, where matplotlib is installed). Without matplotlib
RESULTS.md is still written and the chart is skipped. The report reads files only: it needs
neither PostgreSQL nor the project's dependencies.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import statistics
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
RESULTS = HERE / "results"
MARKDOWN = HERE / "RESULTS.md"
CHART = "throughput.png"  # written into the results directory, beside the files it is drawn from

# The targets set for the benchmarks, in one place so that the tables and the summary agree.
DRAIN_RATIO = 0.8  # outbox / raw loop, with 1 and 2 processes
DRAIN_TARGET_BATCH = 1000  # the batch size the drain target was set at
PGQUEUER_RATIO = 5.0  # outbox / pgqueuer's best configuration
PROCRASTINATE_RATIO = 100.0  # outbox / procrastinate's best configuration
PEERS_JOBS = 200_000  # the peers are judged with as many jobs as the drain has events
ADD_EVENTS_RATIO = 0.85  # add_events / Core executemany
SCALE_ROWS = 1_000_000  # the backlog at which the count and the claim are judged
SCALE_BASE_ROWS = 10_000  # the backlog the claim's growth is measured from
SCALE_MS = 5.0  # the count and the claim, each, below this at SCALE_ROWS
CLAIM_GROWTH = 1.5  # claim time at SCALE_ROWS over claim time at SCALE_BASE_ROWS, below this
WORKER_RSS_MB = 100.0  # a worker's peak resident set, decimal megabytes
VACUUMED_OVER_EMPTY = 2.0  # buffer size after drain + VACUUM (+ REINDEX) over the empty buffer
LATENCY_RATE = 1000.0  # events/s: the rate the latency target is measured at
LATENCY_MODES = ("notify", "polling")  # with LISTEN/NOTIFY, and with polling only

# Sections in this order; any other benchmark follows, by name.
ORDER = (
    "drain_throughput",
    "drain_mariadb",
    "peers",
    "enqueue_cost",
    "scale",
    "claim_contention",
    "claim_floor",
    "gc_settle",
    "memory_bloat",
    "wakeup_latency",
    "autovacuum",
)
TITLES = {
    "drain_throughput": "Drain throughput",
    "drain_mariadb": "Drain throughput on MariaDB",
    "peers": "Against the peers",
    "enqueue_cost": "Cost of enqueue",
    "scale": "Scale",
    "claim_contention": "Claim contention",
    "claim_floor": "What a claim of 1,000 rows costs PostgreSQL",
    "gc_settle": "The garbage collector in a worker",
    "memory_bloat": "Memory and bloat",
    "wakeup_latency": "Wake-up latency",
    "autovacuum": "Autovacuum",
}
# Typography of the report, spelled as escapes so that the source stays plain ASCII around them.
DASH = "\N{EN DASH}"  # ranges (min to max), and "no figure"
TIMES = "\N{MULTIPLICATION SIGN}"  # ratios ("0.88x")

MIN_RUNS = 3  # fewer runs than this and the section says so: a median of one is no median


@dataclass
class Target:
    """One target, the figure measured against it, and whether it is met (None: not measured)."""

    benchmark: str
    target: str
    figure: str
    met: bool | None


@dataclass
class Results:
    """One results file."""

    path: Path
    data: dict[str, Any]

    @property
    def benchmark(self) -> str:
        return str(self.data.get("benchmark", self.path.stem))


# Formatting


def verdict(met: bool | None) -> str:
    """How a target stands; "not met" stands out in the tables."""
    if met is None:
        return "not measured"
    return "met" if met else "**not met**"


def count(value: float) -> str:
    """A rate or a count: whole, with thousands separators."""
    return f"{round(value):,}"


def spread(values: Iterable[float], fmt: Callable[[float], str] = count) -> str:
    """Lowest to highest of several runs; a dash for a single run (it has no spread)."""
    values = list(values)
    if len(values) < 2:
        return DASH
    return f"{fmt(min(values))}{DASH}{fmt(max(values))}"


def ms_spread(value: float, bounds: list[float] | None) -> str:
    """Milliseconds, with their spread (lowest to highest) in brackets when it is known."""
    return f"{value:.2f}" + (f" ({bounds[0]:.2f}{DASH}{bounds[1]:.2f})" if bounds else "")


def timing(row: dict[str, Any], key: str) -> str:
    """A result row's timing in milliseconds, with its spread where the row keeps one; a dash
    where the row has no such timing."""
    if key not in row:
        return DASH
    return ms_spread(row[key], row.get("spread_ms", {}).get(key))


def median(values: Iterable[float]) -> float:
    """The median of the runs, as a float whatever the values' type."""
    return float(statistics.median(list(values)))


def size(value: float) -> str:
    """Bytes in binary units, as PostgreSQL's ``pg_size_pretty`` shows them."""
    if value < 2**20:
        return f"{value / 2**10:,.0f} KiB"
    return f"{value / 2**20:,.1f} MiB"


def target_table(targets: list[Target]) -> list[str]:
    """A benchmark's targets with their figures and verdicts, as a Markdown table."""
    return table(
        ["target", "figure", "verdict"], [[t.target, t.figure, verdict(t.met)] for t in targets]
    )


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table, followed by a blank line."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return [*lines, ""]


def few_runs(runs: int) -> list[str]:
    """A warning when results hold too few runs for their median to mean much."""
    if runs >= MIN_RUNS:
        return []
    return [
        f"These results hold {runs} run{'s' if runs != 1 else ''} only: rerun with "
        f"`--runs {MIN_RUNS}` (or more) for a median and a spread.",
        "",
    ]


# The command behind each results file


def documented_commands(benchmark: str) -> list[str]:
    """The example command lines in a benchmark module's docstring (read, not imported)."""
    module = HERE / f"{benchmark}.py"
    if not module.exists():
        return []
    docstring = ast.get_docstring(ast.parse(module.read_text())) or ""
    commands: list[str] = []
    continued = False
    for line in docstring.splitlines():
        text = line.strip()
        if continued:
            commands[-1] += " " + text.rstrip("\\").strip()
        elif text.startswith(f"python -m benchmarks.{benchmark}"):
            commands.append(text.rstrip("\\").strip())
        else:
            continue
        # A trailing backslash continues the command on the next line, as in a shell.
        continued = text.endswith("\\")
    return commands


def shell(module: str, *options: tuple[str, Any]) -> str:
    """A command line: ``python -m module`` and its options (a True value is a bare flag)."""
    words = ["python", "-m", module]
    for name, value in options:
        if value is True:
            words.append(name)
        elif value is not False and value is not None:
            # 200.0 is typed 200.
            typed = int(value) if isinstance(value, float) and value.is_integer() else value
            words += [name, str(typed)]
    return " ".join(words)


def unique(values: Iterable[Any]) -> str:
    """Comma-separated, first appearance first: an option's list back from the rows."""
    return ",".join(str(v) for v in dict.fromkeys(values))


# Results written before the command was recorded: when they record every option of their
# benchmark, the command is rebuilt from them (options they do not record are at default).


def derived_drain_throughput(data: dict[str, Any]) -> str:
    rows = data["rows"]
    return shell(
        "benchmarks.drain_throughput",
        ("--events", data["events"]),
        ("--batch-sizes", unique(r.get("batch_size", data.get("batch_size")) for r in rows)),
        ("--processes", unique(r["processes"] for r in rows)),
        ("--concurrency", data["worker_threads"]),
        ("--runs", data.get("runs", len(rows[0]["outbox_rates"]))),
        ("--archive", bool(data.get("archive"))),
    )


def derived_peers(data: dict[str, Any]) -> str:
    return shell(
        "benchmarks.peers",
        ("--jobs", data["jobs"]),
        ("--procrastinate-jobs", data["procrastinate_jobs"]),
        ("--runs", data["runs"]),
        ("--pgqueuer", unique(f"{r['consumers']}x{r['batch_size']}" for r in data["pgqueuer"])),
        ("--procrastinate", unique(r["concurrency"] for r in data["procrastinate"])),
    )


def derived_memory_bloat(data: dict[str, Any]) -> str:
    return shell("benchmarks.memory_bloat", ("--events", data["events"]))


def derived_wakeup_latency(data: dict[str, Any]) -> str:
    runs = data["runs"]
    return shell(
        "benchmarks.wakeup_latency",
        ("--rate", data["rate_per_second"]),
        ("--producers", data.get("producers")),
        ("--plain-producers", bool(data.get("plain_producers"))),
        ("--seconds", data["seconds"]),
        ("--runs", max(len(r) for r in runs.values())),
        ("--poll-interval", data["poll_interval"]),
        ("--modes", ",".join(runs)),
    )


def derived_autovacuum(data: dict[str, Any]) -> str:
    return shell(
        "benchmarks.autovacuum",
        ("--seconds", data["seconds_per_variant"]),
        ("--rate", data["rate"]),
        ("--rows", data["rows_per_transaction"]),
        ("--sample-every", data["sample_every_s"]),
        ("--variants", unique(row["variant"] for row in data["rows"])),
    )


DERIVED: dict[str, Callable[[dict[str, Any]], str]] = {
    "drain_throughput": derived_drain_throughput,
    "peers": derived_peers,
    "memory_bloat": derived_memory_bloat,
    "wakeup_latency": derived_wakeup_latency,
    "autovacuum": derived_autovacuum,
}


def command_section(results: Results) -> list[str]:
    """The command that produced the results; if they do not record it, the documented one.

    Results that do not record their command but record every option get, in addition, the
    command rebuilt from those options: the documented command may differ from the run's.
    """
    recorded = results.data.get("command")
    if recorded:
        return ["Produced by:", "", "```sh", str(recorded), "```", ""]
    lines = ["These results do not record the command that produced them."]
    try:
        derived = DERIVED[results.benchmark](results.data)
    except (KeyError, TypeError, ValueError, IndexError):
        derived = None  # not every option is recorded, or a format this report does not know
    if derived:
        lines += ["Rebuilt from the options they record:", "", "```sh", derived, "```", ""]
    documented = documented_commands(results.benchmark)
    if documented:
        lines += ["The documented command:", "", "```sh", *documented, "```"]
    return [*lines, ""]


# One renderer per benchmark: Markdown lines and the targets it judges.

Rendered = tuple[list[str], list[Target]]


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
    rows = sorted(
        data["rows"], key=lambda r: (r.get("batch_size", data.get("batch_size", 0)), r["processes"])
    )
    runs = max(len(row["outbox_rates"]) for row in rows)
    lines = [
        f"{data['events']:,} events, {data.get('worker_threads', '?')} threads per worker, "
        f"{data.get('max_batches', BENCH_MAX_BATCHES)} claim jobs (`max_batches`), "
        f"{'archiving every row' if archive else 'no archive'}"
        + (
            f"; the typed buffer (an Enum, JSON, a DateTime with time zone, a Numeric and a "
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


def best(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The configuration with the highest median: the one a library is compared by."""
    return max(rows, key=lambda row: row["median"])


def peer_configuration(library: str, row: dict[str, Any]) -> str:
    """One configuration of the peers benchmark, in words."""
    if library == "outbox":
        return (
            f"{row['processes']} process, {row['threads']} threads, "
            f"batch {count(row['batch_size'])}"
        )
    if library == "pgqueuer":
        return f"{row['consumers']} consumers, batch {row['batch_size']}"
    return f"{row['workers']} worker, concurrency {row['concurrency']}"


def judged_peers(results: Results) -> bool:
    """Whether peers results are the judged run: as many jobs as the drain's events."""
    return int(results.data["jobs"]) == PEERS_JOBS


def peers(results: Results) -> Rendered:
    """Every configuration of every library; the ratios of outbox to each peer's best."""
    data = results.data
    versions = data.get("versions", {})
    runs = max(
        len(row["rates"]) for lib in ("outbox", "pgqueuer", "procrastinate") for row in data[lib]
    )
    lines = [
        f"No-op jobs, jobs/s; timed: {data.get('timing', 'draining processes')}. "
        f"pgqueuer {versions.get('pgqueuer', '?')}, procrastinate "
        f"{versions.get('procrastinate', '?')}. Each peer's best configuration is the one "
        "compared.",
        "",
        *few_runs(runs),
    ]
    body = []
    for library in ("outbox", "pgqueuer", "procrastinate"):
        jobs = data["procrastinate_jobs"] if library == "procrastinate" else data["jobs"]
        top = best(data[library])
        for row in data[library]:
            body.append(
                [
                    library,
                    peer_configuration(library, row),
                    count(jobs),
                    str(len(row["rates"])),
                    count(row["median"])
                    + (" (best)" if row is top and library != "outbox" else ""),
                    spread(row["rates"]),
                ]
            )
    lines += table(["library", "configuration", "jobs", "runs", "jobs/s", "spread"], body)
    ours = best(data["outbox"])["median"]
    goals = (("pgqueuer", PGQUEUER_RATIO, 2), ("procrastinate", PROCRASTINATE_RATIO, 1))
    ratios = {library: ours / best(data[library])["median"] for library, _, _ in goals}
    figures = {library: f"{ratios[library]:.{n}f}" for library, _, n in goals}
    if not judged_peers(results):
        shown = "; ".join(
            f"outbox / {library} best {figure}" for library, figure in figures.items()
        )
        lines += [
            f"Shown, not judged (the target is set at {count(PEERS_JOBS)} jobs): {shown}.",
            "",
        ]
        return lines, []
    targets = [
        Target(
            "peers",
            f"outbox / {library} best ≥ {goal:g}",
            figures[library],
            ratios[library] >= goal,
        )
        for library, goal, _ in goals
    ]
    lines += target_table(targets)
    return lines, targets


ENQUEUE_MEASURES = {
    "without": "application transaction, no event",
    "with": "application transaction, one event",
    "core": "100 events, Core `executemany` on a Connection",
    "helper": "100 events, `add_events` on a Connection",
    "helper_session": "100 events, `add_events` through a Session",
}


def enqueue_cost(results: Results) -> Rendered:
    """Transaction rates without and with the notify trigger; ``add_events`` against Core."""
    data = results.data
    statements = data.get("statements", {})
    lines = [
        f"Statements sent without an event: {statements.get('without_event')}; with one: "
        f"{statements.get('with_event')}. Transactions/s, medians of the runs, "
        f"spread min{DASH}max.",
        "",
    ]
    targets = []
    for trigger, label in (("no_trigger", "without"), ("notify_trigger", "with")):
        if trigger not in data:
            continue
        section = data[trigger]
        runs = max(len(v) for v in section["rates"].values())
        lines += [f"**{label.capitalize()} the notify trigger**", "", *few_runs(runs)]
        body = [
            [
                description,
                str(len(section["rates"][key])),
                count(median(section["rates"][key])),
                spread(section["rates"][key]),
            ]
            for key, description in ENQUEUE_MEASURES.items()
            if key in section["rates"]
        ]
        lines += table(["measure", "runs", "transactions/s", "spread"], body)
        ratio = section["medians"]["helper"] / section["medians"]["core"]
        target = Target(
            "enqueue_cost",
            f"`add_events` / Core `executemany` ≥ {ADD_EVENTS_RATIO}, {label} the notify trigger",
            f"{ratio:.2f}",
            ratio >= ADD_EVENTS_RATIO,
        )
        targets.append(target)
        with_over_without = section["medians"]["with"] / section["medians"]["without"]
        sentence = (
            f"A transaction with one event runs at {with_over_without:.2f} of the rate without. "
            f"`add_events` against Core: {target.figure} (target ≥ {ADD_EVENTS_RATIO}: "
            f"{verdict(target.met)})."
        )
        # The target compares like with like (both on a Connection); through a Session, as
        # applications call it, the ORM's own cost comes in: shown, not judged.
        session_rates = section["rates"].get("helper_session")
        if session_rates:
            through_session = median(session_rates) / section["medians"]["core"]
            sentence += f" `add_events` through a Session against Core: {through_session:.2f}."
        lines += [sentence, ""]
    lines += concurrent_writers(data.get("concurrent_writers"))
    return lines, targets


def concurrent_writers(data: dict[str, Any] | None) -> list[str]:
    """Commits of many writers side by side, without and with the notify trigger: shown."""
    if not data:
        return []
    rates = data["rates"]
    body = [
        [label, str(len(rates[key])), count(median(rates[key])), spread(rates[key])]
        for key, label in (("no_trigger", "without"), ("notify_trigger", "with"))
    ]
    return [
        f"**{data['writers']} writers side by side** (plain psycopg, one event per transaction, "
        f"{data['seconds']:g} s per run, one connection listening; the two take turns, run by "
        "run)",
        "",
        *table(["notify trigger", "runs", "transactions/s", "spread"], body),
        f"With the trigger, concurrent writers commit {data['trigger_over_plain']:.2f} of the "
        "rate without it: PostgreSQL queues a transaction's notifications at commit under a "
        "lock held across the whole cluster, so notifying commits take turns (shown, not "
        "judged).",
        "",
    ]


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


def flatten(data: Any, prefix: str = "") -> Iterable[tuple[str, str]]:
    """Key and value of every scalar in a nested result, for benchmarks without a renderer."""
    if isinstance(data, dict):
        for key, value in data.items():
            if not prefix and key in {"benchmark", "command", "machine"}:
                continue
            yield from flatten(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(data, list) and data and all(isinstance(v, int | float) for v in data):
        if len(data) > 1:
            yield (
                prefix,
                f"median {median(data):,.4g}, spread {spread(data, lambda v: f'{v:,.4g}')}",
            )
        else:
            yield prefix, f"{data[0]:,.4g}"
    elif isinstance(data, list) and len(data) > GENERIC_LIST:
        yield prefix, f"{len(data)} entries (see the JSON file)"
    elif isinstance(data, list):
        for n, value in enumerate(data):
            yield from flatten(value, f"{prefix}[{n}]")
    else:
        text = str(data).replace("|", "\\|").replace("\n", " ")
        yield prefix, text if len(text) <= 80 else text[:77] + "..."


GENERIC_LIST = 20  # longer lists (samples, for instance) are counted rather than listed


def generic(results: Results, why: str = "") -> Rendered:
    """Every figure of a benchmark the report has no table for, as key and value."""
    why = why or "The report has no table of its own for this benchmark"
    lines = [f"{why}; its figures:", ""]
    lines += table(["figure", "value"], [[f"`{k}`", v] for k, v in flatten(results.data)])
    return lines, []


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
        values = [run[index] for run in runs if run[index] is not None]
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


RENDERERS: dict[str, Callable[[Results], Rendered]] = {
    "drain_throughput": drain_throughput,
    "drain_mariadb": drain_mariadb,
    "peers": peers,
    "enqueue_cost": enqueue_cost,
    "scale": scale,
    "claim_contention": claim_contention,
    "claim_floor": claim_floor,
    "gc_settle": gc_settle,
    "memory_bloat": memory_bloat,
    "wakeup_latency": wakeup_latency,
    "autovacuum": autovacuum,
}


# Said once for a benchmark, before its files: lines, and targets judged across the files.
GROUP_RENDERERS: dict[str, Callable[[list[Results]], Rendered]] = {
    "wakeup_latency": wakeup_latency_group,
}


def sort_key(results: Results) -> tuple[Any, ...]:
    """Files of one benchmark: the plain drain before the archive one; latencies at the
    target rate (1,000 events/s) first, the others by rate."""
    rate = float(results.data.get("rate_per_second", 0))
    other_peers = results.benchmark == "peers" and not judged_peers(results)
    return (
        archived(results),
        tuned(results),
        other_peers,
        rate != LATENCY_RATE,
        rate,
        results.path.name,
    )


def heading(results: Results, link: str) -> str:
    """A file's heading when a benchmark has several: what sets it apart, and its name."""
    name = f"`{link}/{results.path.name}`"
    if results.benchmark == "drain_throughput":
        what = "Archiving every row" if archived(results) else "No archive"
        read = typed(results)
        if read is not None:
            what = f"Typed buffer, the handler reading `batch.{read}`"
            if results.data.get("separate_commands"):
                what += ", separate `outbox work` commands"
            if not distributed(results):
                what += " alone (no `outbox distribute`)"
            judged = ": the target measurement (not drawn)" if judged_typed(results) else ""
            return f"### {what}{judged or ' (not judged, not drawn)'} ({name})"
        if results.data.get("separate_commands"):
            what += ", separate `outbox work` commands (not judged, not drawn)"
        elif by_address(results):
            what += ", the raw loop claiming by address (not judged, not drawn)"
        elif tuned(results):
            what += f", `--max-batches {results.data['max_batches']}` (not judged, not drawn)"
        return f"### {what} ({name})"
    if results.benchmark == "wakeup_latency" and "rate_per_second" in results.data:
        rate = latency_rate(results)
        target = ": the target measurement" if rate == LATENCY_RATE else ""
        return f"### {rate:,g} events/s{target} ({name})"
    if results.benchmark == "peers":
        jobs = count(results.data["jobs"])
        what = ": the target measurement" if judged_peers(results) else " (not judged, not drawn)"
        return f"### {jobs} jobs{what} ({name})"
    return f"### {name}"


# The whole report


def read_results(directory: Path) -> dict[str, list[Results]]:
    """Every results file, grouped by benchmark, in the order of the report."""
    grouped: dict[str, list[Results]] = {}
    for path in sorted(directory.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except ValueError:
            print(f"skipped {path.name}: not JSON", file=sys.stderr)
            continue
        if isinstance(data, dict):
            results = Results(path, data)
            grouped.setdefault(results.benchmark, []).append(results)
    known = [name for name in ORDER if name in grouped]
    others = sorted(name for name in grouped if name not in ORDER)
    return {name: sorted(grouped[name], key=sort_key) for name in [*known, *others]}


def machine_section(grouped: dict[str, list[Results]]) -> list[str]:
    """The machine the results were measured on; each machine once, if there are several."""
    machines: dict[str, list[str]] = {}
    for files in grouped.values():
        for results in files:
            if "machine" in results.data:
                key = json.dumps(results.data["machine"], sort_keys=True)
                machines.setdefault(key, []).append(results.path.name)
    lines = ["## Machine", ""]
    for key, names in machines.items():
        found = json.loads(key)
        if len(machines) > 1:
            lines += [f"For {', '.join(f'`{n}`' for n in names)}:", ""]
        lines += [
            f"- CPUs: {found.get('cpus', '?')}",
            f"- platform: {found.get('platform', '?')}",
            f"- Python: {found.get('python', '?')}",
            f"- PostgreSQL (client of the run): {found.get('postgresql_client', '?')}",
            "",
        ]
    if not machines:
        lines += ["The results record no machine.", ""]
    return lines


def markdown(grouped: dict[str, list[Results]], chart_note: str, link: str = "results") -> str:
    """The whole of RESULTS.md: the chart, the machine, the targets, one section a benchmark.

    ``link``: the results directory as RESULTS.md reaches it (relative to RESULTS.md).
    """
    sections: list[str] = []
    targets: list[Target] = []
    for benchmark, files in grouped.items():
        sections += [f"## {TITLES.get(benchmark, benchmark)}", ""]
        if benchmark in GROUP_RENDERERS:
            try:
                lines, found = GROUP_RENDERERS[benchmark](files)
            except (KeyError, IndexError, TypeError, ValueError, ZeroDivisionError) as error:
                # As for one file below: the files themselves are still shown.
                print(f"{benchmark}: {error!r}; no summary across its files", file=sys.stderr)
                lines, found = [], []
            sections += lines
            targets += found
        render = RENDERERS.get(benchmark, generic)
        for results in files:
            if len(files) > 1:
                sections += [heading(results, link), ""]
            else:
                sections += [f"From `{link}/{results.path.name}`.", ""]
            sections += command_section(results)
            try:
                lines, found = render(results)
            except (KeyError, IndexError, TypeError, ValueError, ZeroDivisionError) as error:
                # A format this report does not know yet (a benchmark changed its output):
                # show the figures as they are rather than fail the whole report.
                print(f"{results.path.name}: {error!r}; shown as key and value", file=sys.stderr)
                lines, found = generic(results, f"The report does not know this format ({error!r})")
            sections += lines
            targets += found
    head = [
        "# Benchmark results",
        "",
        "Generated by `.bench-venv/bin/python -m benchmarks.report` from the JSON files in "
        f"`{link}/`; regenerate it rather than edit it. How each benchmark works: "
        "[README.md](README.md).",
        "",
        f"![throughput]({link}/{CHART})",
        "",
        chart_note,
        "",
        *machine_section(grouped),
        "## Targets",
        "",
        *table(
            ["benchmark", "target", "figure", "verdict"],
            [[t.benchmark, t.target, t.figure, verdict(t.met)] for t in targets],
        ),
    ]
    return "\n".join([*head, *sections]).rstrip() + "\n"


def drain_series(results: Results) -> dict[tuple[str, int], list[tuple[int, list[float]]]]:
    """(variant, processes) → [(batch size, rates of the runs)], sorted by batch size."""
    data = results.data
    series: dict[tuple[str, int], list[tuple[int, list[float]]]] = {}
    for row in data["rows"]:
        batch = int(row.get("batch_size", data.get("batch_size", 0)))
        for variant in ("raw", "outbox"):
            series.setdefault((variant, row["processes"]), []).append(
                (batch, [float(r) for r in row[f"{variant}_rates"]])
            )
    return {key: sorted(points) for key, points in series.items()}


# The chart. One colour per process count, one line style per variant: the legend is
# read as (variant, processes). The peers' colours are kept apart from the processes'.
COLOURS = {1: "tab:blue", 2: "tab:orange", 3: "tab:cyan", 4: "tab:olive"}
PEER_LINES = {
    "pgqueuer": ("tab:green", "-."),
    "procrastinate": ("tab:red", "-."),
    "outbox": ("tab:purple", ":"),
}


def plot_drain(axes: Any, results: Results) -> tuple[set[int], int]:
    """One line per (variant, processes) against batch size; the batch sizes and most runs."""
    sizes: set[int] = set()
    runs = 0
    ordered = sorted(drain_series(results).items(), key=lambda i: (i[0][0] != "outbox", i[0][1]))
    for (variant, processes), points in ordered:
        xs = [batch for batch, _ in points]
        medians = [median(rates) for _, rates in points]
        rates = [r for _, r in points]
        sizes.update(xs)
        runs = max([runs, *(len(r) for r in rates)])
        colour = COLOURS.get(processes, "tab:gray")
        name = "outbox" if variant == "outbox" else "raw loop (ceiling)"
        axes.errorbar(
            xs,
            medians,
            yerr=[
                [m - min(r) for m, r in zip(medians, rates, strict=True)],
                [max(r) - m for m, r in zip(medians, rates, strict=True)],
            ],
            label=f"{name}, {processes} process{'es' * (processes > 1)}",
            color=colour,
            linestyle="-" if variant == "outbox" else "--",
            marker="o" if variant == "outbox" else "s",
            markersize=6,
            linewidth=2,
            capsize=4,
        )
        # The figure at each point: the chart is read for its numbers. One process's to the
        # left of the point and more processes' to the right, since their rates are often
        # close; on a light box, as lines pass behind them.
        left = processes == 1
        for x, y in zip(xs, medians, strict=True):
            axes.annotate(
                f"{y / 1000:.1f}k",
                (x, y),
                textcoords="offset points",
                xytext=(-8 if left else 8, 0),
                ha="right" if left else "left",
                va="center",
                fontsize=8,
                color=colour,
                bbox={
                    "boxstyle": "round,pad=0.15",
                    "facecolor": "white",
                    "edgecolor": "none",
                    "alpha": 0.8,
                },
            )
    return sizes, runs


def plot_peers(axes: Any, results: Results) -> None:
    """Each peer's best rate, and outbox's in the same run, as horizontal reference lines."""
    data = results.data
    lines = [
        (library, jobs, best(data[library]))
        for library, jobs in (
            ("pgqueuer", data["jobs"]),
            ("procrastinate", data["procrastinate_jobs"]),
            ("outbox", data["jobs"]),
        )
    ]
    rates = sorted(top["median"] for _, _, top in lines)
    for library, jobs, top in lines:
        colour, style = PEER_LINES[library]
        what = "best" if library != "outbox" else "in the peers run"
        axes.axhline(
            top["median"],
            color=colour,
            linestyle=style,
            linewidth=1.5,
            label=f"{library} {what}: {count(top['median'])} jobs/s "
            f"({peer_configuration(library, top)}; {count(jobs)} jobs)",
        )
        # Named on the line too, at the right edge, which is kept clear of the drain's points:
        # above it, or below it when the next line up is close enough for the names to meet.
        above = [r for r in rates if r > top["median"]]
        below = bool(above) and above[0] < 2 * top["median"]
        axes.annotate(
            f"{library} {what}: {count(top['median'])}/s",
            (0.99, top["median"]),
            xycoords=("axes fraction", "data"),
            textcoords="offset points",
            xytext=(0, -3 if below else 3),
            ha="right",
            va="top" if below else "bottom",
            fontsize=8,
            color=colour,
        )


def style_axes(axes: Any, sizes: set[int], room_right: bool) -> None:
    """Log scales with plain numbers; ticks at the measured batch sizes only."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    axes.set_xscale("log")
    axes.set_yscale("log")
    if sizes:
        ordered = sorted(sizes)
        # Room on the right for the reference lines' names.
        axes.set_xlim(ordered[0] / 1.6, ordered[-1] * (5 if room_right else 1.6))
        axes.xaxis.set_major_locator(FixedLocator(ordered))
    axes.xaxis.set_minor_formatter(NullFormatter())
    axes.yaxis.set_minor_formatter(NullFormatter())
    plain = FuncFormatter(lambda v, _: f"{v:,.0f}")
    axes.xaxis.set_major_formatter(plain)
    axes.yaxis.set_major_formatter(plain)
    axes.set_xlabel("batch size (events per claim)")
    axes.grid(True, which="major", alpha=0.3)


def chart(grouped: dict[str, list[Results]], path: Path, link: str) -> tuple[bool, str]:
    """Draw the throughput chart into ``path``; whether it was drawn, and what RESULTS.md says.

    The plain drain and the peers share one panel; drains with ``--archive``, if any, get a
    panel of their own (the peers do not archive).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display on a server
        import matplotlib.pyplot as plt
    except ImportError:
        return False, (
            "The chart was skipped by the last run of the report (matplotlib is not installed; "
            "run it with `.bench-venv/bin/python`): the image may be missing or stale."
        )
    drains = [r for r in grouped.get("drain_throughput", []) if not tuned(r)]
    peer_results = [r for r in grouped.get("peers", []) if judged_peers(r)]
    if not drains and not peer_results:
        return False, "No drain or peers results: the chart was skipped."
    panels = [("no archive", [r for r in drains if not archived(r)])]
    archiving = [r for r in drains if archived(r)]
    if archiving:
        panels.append(("archiving every row", archiving))
    # Panels one above the other, so that the image stays readable at a page's width.
    figure, grid = plt.subplots(
        len(panels), 1, figsize=(10, 6.5 * len(panels)), sharex=False, sharey=True, squeeze=False
    )
    runs, events = 0, set()
    for n, (axes, (caption, files)) in enumerate(zip(grid[:, 0], panels, strict=True)):
        sizes: set[int] = set()
        for results in files:
            found, most = plot_drain(axes, results)
            sizes |= found
            runs = max(runs, most)
            events.add(int(results.data["events"]))
        for results in peer_results if n == 0 else []:
            plot_peers(axes, results)
        # Each panel spans its own batch sizes, with room for the peers' names where they are.
        style_axes(axes, sizes, room_right=bool(peer_results))
        axes.set_ylabel("events/s (jobs/s for the peers), log scale")
        if len(panels) > 1:
            axes.set_title(caption, fontsize=10)
        # matplotlib lists plain lines (the peers) before error bars (the drains); the drains
        # are the subject, so they come first.
        handles, labels = axes.get_legend_handles_labels()
        order = sorted(range(len(labels)), key=lambda i: "jobs/s" in labels[i])
        axes.legend(
            [handles[i] for i in order],
            [labels[i] for i in order],
            loc="upper center",
            bbox_to_anchor=(0.5, -0.11),
            ncol=2,
            fontsize=8.5,
            frameon=False,
        )
    low, high = grid[0][0].get_ylim()
    grid[0][0].set_ylim(low / 1.5, high * 1.5)
    counted = ", ".join(f"{e:,}" for e in sorted(events)) or DASH
    figure.suptitle(
        f"Drain throughput against batch size: {counted} events, "
        + (f"median of {runs} runs (bars: min{DASH}max)" if runs > 1 else "1 run")
        + ", process start-up included",
        fontsize=11,
    )
    figure.tight_layout()
    figure.savefig(path, dpi=130)
    plt.close(figure)
    return True, (
        f"The chart (`{link}/{path.name}`) is drawn from the drain throughput and peers results."
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.report", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--results",
        type=Path,
        default=RESULTS,
        metavar="DIR",
        help="the JSON files to read; the chart is written there (default: %(default)s)",
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=MARKDOWN,
        metavar="FILE",
        help="the Markdown report to write (default: %(default)s)",
    )
    args = parser.parse_args()
    if not args.results.is_dir():
        parser.error(f"--results: {args.results} is not a directory")
    # RESULTS.md links the chart and names the files relative to itself, as a reader of the
    # repository follows them.
    link = Path(os.path.relpath(args.results.resolve(), args.output.resolve().parent)).as_posix()
    grouped = read_results(args.results)
    path = args.results / CHART
    drawn, note = chart(grouped, path, link)
    args.output.write_text(markdown(grouped, note, link))
    print(f"wrote {args.output}")
    print(f"wrote {path}" if drawn else note)


if __name__ == "__main__":
    main()
