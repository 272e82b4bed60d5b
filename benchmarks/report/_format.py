"""How the report writes: the results files, the targets' verdicts, numbers, spreads and tables."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The benchmarks folder: the results, RESULTS.md and the benchmarks' modules live there.
HERE = Path(__file__).resolve().parents[1]


RESULTS = HERE / "results"


MARKDOWN = HERE / "RESULTS.md"


CHART = "throughput.png"  # written into the results directory, beside the files it is drawn from


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


Rendered = tuple[list[str], list[Target]]
