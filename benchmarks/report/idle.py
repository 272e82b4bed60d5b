"""Idle buffers: what distribution and a worker's idle loop cost per buffer with nothing in it."""

from __future__ import annotations

from typing import Any

from benchmarks.report._format import DASH, TIMES, Rendered, Results, table

IDLE_MEASURES = {
    "distribute": "distribution, no tick",
    "distribute_on_tick": "distribution on a tick",
    "distribute_one_by_one": "distribution, no tick, a handler at a time (before)",
    "distribute_on_tick_one_by_one": "distribution on a tick, a handler at a time (before)",
    "acquire": "a worker's idle poll (`handler IN` every name)",
    "flow_refresh": "a worker's read of pauses and breakers",
    "distribution_watch": "the leader's watch for undistributed events",
}


def _figure(value: Any, digits: int = 1) -> str:
    return DASH if value is None else f"{value:,.{digits}f}"


def _pair(figures: dict[str, Any], small: str, large: str, key: str, digits: int = 1) -> str:
    few, many = figures[small].get(key), figures[large].get(key)
    text = f"{_figure(few, digits)} / {_figure(many, digits)}"
    if few and many is not None:
        text += f" ({many / few:.1f}{TIMES})"
    return text


def idle_buffers(results: Results) -> Rendered:
    """One call of each measure with the busy buffers alone and among the idle ones."""
    data = results.data
    busy, buffers = data["busy"], data["buffers"]
    small, large = f"{busy}_buffers", f"{buffers}_buffers"
    lines = [
        f"On {data.get('database', 'postgresql')}: {busy} buffers with "
        f"{data['events_per_busy_buffer']} events each, alone, then among {buffers} buffers "
        f"({buffers - busy} empty). Per call, the median of {data['rounds']} rounds of "
        f"{data['ticks']} calls: {busy} buffers / {buffers} buffers (ratio). Server CPU: the "
        "database's backends, per call over a round (claim jobs deleted between calls "
        f"included; {DASH}: not readable or below the clock's hundredth of a second).",
        "",
    ]
    body = [
        [
            label,
            _pair(data["per_call_median"][key], small, large, "statements", 0),
            _pair(data["per_call_median"][key], small, large, "wall_ms"),
            _pair(data["per_call_median"][key], small, large, "client_cpu_ms"),
            _pair(data["per_call_median"][key], small, large, "server_cpu_ms"),
        ]
        for key, label in IDLE_MEASURES.items()
        if key in data["per_call_median"]
    ]
    lines += table(["call", "statements", "wall ms", "client CPU ms", "server CPU ms"], body)
    if data.get("database") == "postgresql":
        lines += [
            "The probes of the empty buffers are planned at each run until the driver prepares "
            "them (psycopg: from the sixth run on a connection). In each round the calls "
            "without a tick come first, after the one-by-one calls of the round before pushed "
            "them out of psycopg's cache of 100 prepared statements: they show the probes "
            "planned each time; the calls on a tick, prepared.",
            "",
        ]
    return lines, []
