"""The whole report: the sections in order, the machine, the targets' summary; the command."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.report._format import (
    CHART,
    MARKDOWN,
    RESULTS,
    Rendered,
    Results,
    Target,
    count,
    table,
    verdict,
)
from benchmarks.report.chart import chart
from benchmarks.report.claims import claim_contention, claim_floor, scale
from benchmarks.report.commands import command_section
from benchmarks.report.console import console_big_tables, ingest_http
from benchmarks.report.drain import (
    archived,
    by_address,
    distributed,
    drain_mariadb,
    drain_throughput,
    judged_typed,
    tuned,
    typed,
)
from benchmarks.report.enqueue import enqueue_cost
from benchmarks.report.fanout import fanout, fanout_group
from benchmarks.report.flags import flags, flags_group
from benchmarks.report.flow import drain_rate_limited, handler_outcomes
from benchmarks.report.generic import generic
from benchmarks.report.idle import idle_buffers
from benchmarks.report.inbox import inbox, inbox_group
from benchmarks.report.latency import latency_rate, wakeup_latency, wakeup_latency_group
from benchmarks.report.many import many_databases
from benchmarks.report.memory import autovacuum, gc_settle, memory_bloat
from benchmarks.report.peers import judged_peers, peers
from benchmarks.report.retention import retention, retention_migration
from benchmarks.report.scaling import autoscaling, scaling_read
from benchmarks.report.sections import ORDER, TITLES
from benchmarks.report.sinks import sink_nats, sink_rabbitmq, sink_redis
from benchmarks.report.startup import startup
from benchmarks.report.statements import statement_account
from benchmarks.report.targets import LATENCY_RATE

RENDERERS: dict[str, Callable[[Results], Rendered]] = {
    "drain_throughput": drain_throughput,
    "drain_mariadb": drain_mariadb,
    "drain_rate_limited": drain_rate_limited,
    "handler_outcomes": handler_outcomes,
    "peers": peers,
    "enqueue_cost": enqueue_cost,
    "idle_buffers": idle_buffers,
    "scale": scale,
    "claim_contention": claim_contention,
    "claim_floor": claim_floor,
    "statement_account": statement_account,
    "gc_settle": gc_settle,
    "memory_bloat": memory_bloat,
    "wakeup_latency": wakeup_latency,
    "autovacuum": autovacuum,
    "retention": retention,
    "retention_migration": retention_migration,
    "sink_rabbitmq": sink_rabbitmq,
    "sink_nats": sink_nats,
    "sink_redis": sink_redis,
    "console_big_tables": console_big_tables,
    "ingest_http": ingest_http,
    "scaling_read": scaling_read,
    "autoscaling": autoscaling,
    "startup": startup,
    "many_databases": many_databases,
    "inbox": inbox,
    "flags": flags,
    "fanout": fanout,
}


# Said once for a benchmark, before its files: lines, and targets judged across the files.
GROUP_RENDERERS: dict[str, Callable[[list[Results]], Rendered]] = {
    "wakeup_latency": wakeup_latency_group,
    "inbox": inbox_group,
    "flags": flags_group,
    "fanout": fanout_group,
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
            if read == "json":
                what = "JSON buffer (a document per event), the handler reading `batch.events`"
            if by_address(results):
                what += ", the raw loop claiming by address"
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


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.report",
        description="Results report: benchmarks/RESULTS.md and a throughput chart.",
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
