"""The command behind each results file: recorded with it, or rebuilt from what it records."""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable
from typing import Any

from benchmarks.report._format import HERE, Results


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
