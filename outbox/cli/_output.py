"""Plain-text tables and the units they show."""

from __future__ import annotations

import json
from typing import Any

import click

from outbox._core.values import jsonable


def print_table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    table = [header, *rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


def error_text(error: str | None, limit: int = 200) -> str:
    """An error in a table cell: its first line (outbox keeps the type and message there,
    the traceback after), shortened."""
    lines = (error or "").strip().splitlines()
    return lines[0][:limit] if lines else ""


def bytes_text(size: int) -> str:
    value, unit = float(size), "B"
    for larger in ("KiB", "MiB", "GiB"):
        if value < 1024:
            break
        value, unit = value / 1024, larger
    return f"{size} B" if unit == "B" else f"{value:.1f} {unit}"


def ratio_text(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def print_json(value: Any) -> None:
    """One JSON document: dataclasses as objects, enums as their words, UUIDs, times and
    decimals as text, bytes as base64."""
    click.echo(json.dumps(jsonable(value), indent=2, sort_keys=True))


def json_text(value: Any) -> str:
    """``value`` as one line of JSON, every character past ASCII escaped: a payload shown in a
    terminal, where a control character in it could not rewrite the screen."""
    return json.dumps(jsonable(value), sort_keys=True, ensure_ascii=True)
