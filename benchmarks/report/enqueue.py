"""The cost of enqueue: what writing events adds to the application's transaction."""

from __future__ import annotations

from typing import Any

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
    verdict,
)
from benchmarks.report.targets import ADD_EVENTS_RATIO

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
