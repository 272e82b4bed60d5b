"""The statement account: every statement a drain sends, per group, from pg_stat_statements."""

from __future__ import annotations

from typing import Any

from benchmarks.report._format import TIMES, Rendered, Results, count, table

SHOWN_QUERY_CHARS = 80
# A statement called fewer times than this share of the groups is folded into one row: the
# start-up's, and what comes once a second or so.
SHOWN_PER_GROUP = 0.02
# The worker's bookkeeping the summary counts (labels of benchmarks.statement_account).
BOOKKEEPING = ("heartbeat", "throughput record", "read pauses and breakers")


def statement_account(results: Results) -> Rendered:
    """A summary row per variant, then a table per variant, statement by statement."""
    data = results.data
    groups, events = data["groups"], data["events"]
    lines = [
        f"{count(events)} events in groups of {count(data['batch_size'])} ({count(groups)} "
        "groups), drained on a private PostgreSQL 15 cluster with `pg_stat_statements` "
        "(`track = all`, `track_planning`), reset after each load; the account holds what the "
        "drain's own role sent, from its first connection to its last. One run of each: the "
        "counts are exact, the times this machine's at that moment (compare them side by side). "
        "Server: execution and planning time as `pg_stat_statements` counts it; backends' CPU: "
        "the CPU seconds of the server's backends over the drain (parsing, the protocol and "
        "connections too, but not the waits on row locks and I/O that the server's time "
        "holds). `raw`: `benchmarks/_raw_drain.py by-address`; `burst`: "
        "`outbox work --burst`, heartbeats, lease extensions, throughput records and the reading "
        "of pauses and breakers included, as in production (none can be turned off); "
        "`running`: `outbox work`, stopped once the buffer is empty; `paused`: the same, the "
        "handler paused for 2 s a quarter of the way and resumed (the operator's statements, "
        "connected as the drain's role, included). Every group: the statements each group "
        "sends, each statement's calls per group rounded down (0.95 or more counts as one); "
        "the rest comes once a run or "
        "once a second (acquiring and giving back the claim job, distribution, the worker's "
        "bookkeeping, connections), whatever the number of groups.",
        "",
    ]
    body = []
    for row in data["variants"]:
        calls = {name: 0 for name in BOOKKEEPING}
        for statement in row["statements"]:
            if statement["label"] in calls:
                calls[statement["label"]] += statement["calls"]
        floor = whole_per_group(row["statements"], groups)
        backends = row["server_cpu_seconds"]
        body.append([
            row["variant"],
            count(row["calls"]),
            f"{row['calls_per_group']:.2f}",
            f"{row['calls_per_event']:.4f}",
            str(floor),
            f"{row['calls_per_group'] - floor:.2f}",
            " / ".join(count(n) for n in calls.values()),
            f"{row['server_ms_per_group']:.2f}",
            f"{row['server_us_per_event']:.1f}",
            f"{(row['exec_ms'] + row['plan_ms']) / 1000:.2f}",
            "n/a" if backends is None else f"{backends:.2f}",
            f"{row['seconds']:.1f}",
        ])  # fmt: skip
    header = ["variant", "statements", "per group", "per event", "every group",
              "the rest, per group", "heartbeats / throughput records / pause reads",
              "server ms per group", "server µs per event", "server s", "backends' CPU s",
              "drain s"]  # fmt: skip
    lines += table(header, body)
    loads = ", ".join(f"{row['load_average']:.2f}" for row in data["variants"])
    lines += [
        f"The machine's load average (1 minute, {data['machine']['cpus']} CPUs) at each "
        f"variant's start, in the order above: {loads}.",
        "",
    ]
    lines += [
        "What every group sends, statement by statement (calls per group, rounded down; 0.95 "
        "or more counts as one):",
        "",
    ]
    lines += table(
        ["variant", "every group"],
        [[row["variant"], every_group(row["statements"], groups)] for row in data["variants"]],
    )
    for row in data["variants"]:
        lines += variant_table(row, groups)
    return lines, []


def whole_per_group(statements: list[dict[str, Any]], groups: int) -> int:
    """The statements every group sends: each statement's calls per group, rounded down (a
    statement sent once a second, or once a run, adds a fraction; see :func:`whole_calls`)."""
    return sum(whole_calls(s["calls"], groups) for s in statements)


def whole_calls(calls: int, groups: int) -> int:
    """Calls per group, rounded down, but for a call or two short of a whole one per group (a
    group whose claim job was released, say): 0.95 a group or more counts as one."""
    return int(calls / groups + 0.05)


def every_group(statements: list[dict[str, Any]], groups: int) -> str:
    """The statements every group sends, by label, with how many of each."""
    calls: dict[str, int] = {}
    for statement in statements:
        whole = whole_calls(statement["calls"], groups)
        if whole:
            calls[statement["label"]] = calls.get(statement["label"], 0) + whole
    return "; ".join(f"{label} {TIMES}{n}" if n > 1 else label for label, n in calls.items())


def variant_table(row: dict[str, Any], groups: int) -> list[str]:
    """One variant's statements, the most called first; the rare ones folded into one row."""
    shown = [s for s in row["statements"] if s["calls"] >= SHOWN_PER_GROUP * groups]
    rest = [s for s in row["statements"] if s["calls"] < SHOWN_PER_GROUP * groups]
    steps = row.get("steps", {})
    head = f"**{row['variant']}** ({row['seconds']:.1f} s"
    if "left_when_paused" in steps:
        head += (
            f"; paused at {steps['paused_at']:.1f} s with {count(steps['left_when_paused'])} "
            f"events left, {count(steps['left_when_resumed'])} left at the resume"
        )
    lines = [head + "):", ""]
    body = [
        [
            s["label"],
            f"`{s['query'][:SHOWN_QUERY_CHARS].replace('|', '¦')}`",
            count(s["calls"]),
            f"{s['calls_per_group']:.3f}",
            f"{s['mean_exec_ms']:.3f}",
            f"{s['total_exec_ms']:,.1f}",
            f"{s['total_plan_ms']:,.1f}",
            count(s["plans"]),
            count(s["rows"]),
        ]
        for s in shown
    ]
    if rest:
        calls = sum(s["calls"] for s in rest)
        body.append([
            f"{len(rest)} others (start-up, per tick)",
            "",
            count(calls),
            f"{calls / groups:.3f}",
            "",
            f"{sum(s['total_exec_ms'] for s in rest):,.1f}",
            f"{sum(s['total_plan_ms'] for s in rest):,.1f}",
            count(sum(s["plans"] for s in rest)),
            count(sum(s["rows"] for s in rest)),
        ])  # fmt: skip
    header = ["statement", "text", "calls", "per group", "mean ms", "total ms", "plan ms",
              "plans", "rows"]  # fmt: skip
    return lines + table(header, body)
