"""Any other results file: its values as a flat table."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from benchmarks.report._format import Rendered, Results, median, spread, table


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
