"""Many databases under one ``outbox work``: fairness across them, and one going away."""

from __future__ import annotations

from typing import Any

from benchmarks.report._format import (
    DASH,
    TIMES,
    Rendered,
    Results,
    Target,
    count,
    table,
    target_table,
)
from benchmarks.report.targets import OUTAGE_P95_RATIO

BENCHMARK = "many databases"
AT_MOST = "\N{LESS-THAN OR EQUAL TO}"


def _seconds(value: float | None) -> str:
    return DASH if value is None else f"{value:g} s"


def _fairness(data: dict[str, Any]) -> list[str]:
    """Each run of the small database's events, with and without the big one's backlog."""
    how = "notify triggers installed" if data["notify_triggers"] else "polling only"
    lines = [
        f"**Fairness**: {data['small_events']:,} events written in one transaction to `small` "
        f"while `big` drains {data['events']:,} events written before the start (baseline: "
        f"`big` empty); one worker process per database, {how}. Latency: the events' "
        "`created_at` to their handler's start; all handled: the commit's return to the last "
        "handler start.",
        "",
    ]
    rows = []
    for run in data["runs"]:
        small, big = run["small"], run.get("big")
        rows.append(
            [
                run["variant"],
                DASH if big is None else count(big["waiting_when_small_written"]),
                f"{small['all_handled_after_commit_ms']:,.1f}",
                f"{small['p50_ms']:,.1f}",
                f"{small['max_ms']:,.1f}",
                DASH if big is None else count(big["events_per_second"]),
            ]
        )
    lines += table(
        [
            "run",
            "big's events waiting when small was written",
            "small: all handled, ms after commit",
            "latency p50, ms",
            "latency max, ms",
            "big drained, events/s",
        ],
        rows,
    )
    medians, ratios = data["medians"], data["backlog_over_baseline"]
    runs = data["runs"]
    # The variants take turns, baseline first: each pair's ratio, since the machine drifts.
    pairs = [
        backlog["small"]["all_handled_after_commit_ms"]
        / baseline["small"]["all_handled_after_commit_ms"]
        for baseline, backlog in zip(runs[::2], runs[1::2], strict=True)
    ]
    lines += [
        "Medians, backlog against baseline: all handled "
        f"{medians['backlog']['all_handled_after_commit_ms']:,.1f} ms against "
        f"{medians['baseline']['all_handled_after_commit_ms']:,.1f} ms "
        f"({ratios['all_handled_after_commit_ms']:.2f}{TIMES}); latency p50 "
        f"{medians['backlog']['p50_ms']:,.1f} against {medians['baseline']['p50_ms']:,.1f} ms "
        f"({ratios['p50_ms']:.2f}{TIMES}). All handled, backlog over baseline, pair by pair: "
        + ", ".join(f"{ratio:.2f}{TIMES}" for ratio in pairs)
        + ".",
        "",
    ]
    return lines


def _outage(data: dict[str, Any]) -> tuple[list[str], list[Target]]:
    """Each run's oldest-age p95 per database, the downed one's recovery, the pairs' ratios."""
    seconds = data["seconds"]
    lines = [
        f"**Outage**: `a` and `b` on the machine's PostgreSQL, `c` on a private cluster; "
        f"{data['rate_per_second']:g} events/s committed to each, one per transaction, for "
        f"{seconds:g} s; `c`'s server stopped (`pg_ctl stop -m immediate`) a third of the way in "
        "and started again two thirds of the way in. Oldest age: the oldest event still in the "
        "buffer, sampled about every 0.5 s.",
        "",
    ]
    rows = []
    for run in data["runs"]:
        dbs = run["databases"]
        c = dbs["c"]
        recovery = c.get("outage")
        rows.append(
            [
                run["variant"],
                *(f"{dbs[name]['oldest_age_p95_s']:.3f}" for name in ("a", "b", "c")),
                f"{c['committed']:,} / {c['in_doubt']} / {c['handled']:,} / {c['lost']}",
                DASH if recovery is None else count(recovery["waiting_at_stop"]),
                DASH
                if recovery is None
                else _seconds(recovery["last_of_them_handled_after_restart_s"]),
                _seconds(run.get("worker_recovered_after_restart_s")),
                DASH
                if recovery is None
                else _seconds(recovery["oldest_age_back_under_it_after_restart_s"]),
            ]
        )
    lines += table(
        [
            "run",
            "a: oldest age p95, s",
            "b",
            "c",
            "c: committed / in doubt / handled / lost",
            "c: waiting at the stop",
            "c: the last of them handled, after restart",
            "c: its worker logged the database back, after restart",
            "c: oldest age back to its level before, after restart",
        ],
        rows,
    )
    ratios = data["ratios"]
    lines += table(
        ["pair (baseline, outage)", "a: p95 outage / baseline", "b"],
        [
            [str(n + 1), f"{pair['a']:.2f}{TIMES}", f"{pair['b']:.2f}{TIMES}"]
            for n, pair in enumerate(ratios)
        ],
    )
    every = [r for pair in ratios for r in pair.values()]
    recoveries = [
        run["databases"]["c"]["outage"]["last_of_them_handled_after_restart_s"]
        for run in data["runs"]
        if "outage" in run["databases"]["c"]
    ]
    lost = sum(d["lost"] for run in data["runs"] for d in run["databases"].values())
    targets = [
        Target(
            BENCHMARK,
            "oldest-age p95 of the databases that stayed up, outage / baseline "
            f"{AT_MOST} {OUTAGE_P95_RATIO:.2f}, every pair",
            ", ".join(f"{r:.2f}" for r in every),
            all(r <= OUTAGE_P95_RATIO for r in every),
        ),
        Target(
            BENCHMARK,
            "the downed database's waiting events handled after it came back",
            "after " + ", ".join(_seconds(r) for r in recoveries),
            bool(recoveries) and all(r is not None for r in recoveries),
        ),
        Target(
            BENCHMARK,
            "no event lost (every acknowledged commit handled), every database and run",
            f"{lost} lost",
            bool(data["none_lost"]),
        ),
    ]
    return lines, targets


def many_databases(results: Results) -> Rendered:
    """Both scenarios, each when the results hold it."""
    data = results.data
    lines: list[str] = []
    targets: list[Target] = []
    if "fairness" in data:
        lines += _fairness(data["fairness"])
    if "outage" in data:
        found, targets = _outage(data["outage"])
        lines += found
        lines += target_table(targets)
    return lines, targets
