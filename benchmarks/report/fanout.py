"""The fan-out's proof: one buffer, four consumers (healthy, paused, failing half its calls,
rate-limited), workers killed; per database, what each consumer was handed and how far it
lagged."""

from __future__ import annotations

from typing import Any

from benchmarks.report._format import DASH, Rendered, Results, Target, count, table

BENCHMARK = "fanout"
NAMES = {"postgresql": "PostgreSQL", "mariadb": "MariaDB", "sqlite": "SQLite"}
TROUBLE = {
    "healthy": "handles every group at once",
    "paused": "paused before the first event, resumed after {pause:g} s",
    "failing": "raises on {fail:.0%} of its calls at random, each group retried {retry:g} s later",
    "limited": "`RateLimit` of {calls:g} call{s} a second ({events:,.0f} events), {cap}",
}


def _database(data: dict[str, Any]) -> str:
    return NAMES.get(str(data["database"]), str(data["database"]))


def _capped(data: dict[str, Any]) -> bool:
    """Whether the limited consumer had a cap on its groups in flight, as docs/timeliness.md
    advises (a run without one shows what the cap prevents, and is not judged on ages)."""
    return bool(data["options"].get("limited_concurrency"))


def _run(data: dict[str, Any]) -> str:
    """The database, and what sets the run apart from the others of its database."""
    apart = [] if data["kills"] else ["without kills"]
    apart += [] if _capped(data) else ["`limited` uncapped"]
    return ", ".join([_database(data), *apart])


def _seconds(value: float | None) -> str:
    return DASH if value is None else f"{value:,.1f}"


def _all_gone(data: dict[str, Any]) -> bool:
    return not any(data["left"].values()) and data["dead_letters"] == 0


def fanout_group(files: list[Results]) -> Rendered:
    """One row per database, and the targets each meets or not: every consumer gets every
    event and the rows are gone; the healthy consumer keeps its promise."""
    rows, targets = [], []
    for results in files:
        data = results.data
        consumers = data["consumers"]
        healthy = consumers["healthy"]["age"]["max"]
        lost = sum(found["lost"] for found in consumers.values())
        rows.append(
            [
                _run(data),
                count(data["written"]),
                f"{data['write_seconds']:,.0f}",
                str(len(data["kills"])),
                f"{healthy:,.1f} / {data['promise']:g}",
                *(f"{consumers[n]['age']['max']:,.0f}" for n in ("paused", "failing", "limited")),
                " / ".join(str(found["lost"]) for found in consumers.values()),
                " / ".join(count(found["duplicates"]) for found in consumers.values()),
                "none" if _all_gone(data) else "**some**",
                f"{data['seconds']:,.0f}",
            ]
        )
        database = _run(data)
        targets.append(
            Target(
                BENCHMARK,
                f"{database}: {count(data['written'])} events fanned out to four consumers"
                + (", workers killed" if data["kills"] else "")
                + ": each consumer gets every event, and the rows are gone",
                f"{lost} lost, {sum(data['left'].values())} rows left, {data['dead_letters']} dead",
                lost == 0 and _all_gone(data),
            )
        )
        if not _capped(data):
            continue
        targets.append(
            Target(
                BENCHMARK,
                f"{database}: the healthy consumer's oldest event within its promise "
                f"({data['promise']:g} s) while the others lag",
                f"{healthy:,.1f} s at most",
                healthy <= data["promise"],
            )
        )
    lines = [
        "One buffer the application writes (a writer process, transactions of 100 events at a "
        "steady rate), fanned out (`Outbox.fanout`) to four consumers, each its own buffer and "
        "handler, all in `Urgency.REALTIME` (a minute's promise): a healthy one and three in "
        "trouble, one paused for a minute, one failing half its calls, one rate-limited below "
        "the rate written. One `outbox work --processes 2` runs them all; its worker processes "
        "are SIGKILLed at random points of the run. Ages are the oldest event's in each "
        "consumer's buffer, since the application wrote it, sampled every half second; lost, "
        "duplicates: healthy / paused / failing / limited, from what each consumer's calls "
        "recorded (a duplicate is an event handed again after a kill between its call and its "
        "commit). Rows left: in the source and the four buffers, and dead letters, at the end.",
        "",
    ]
    lines += table(
        [
            "database",
            "events",
            "writing, s",
            "kills",
            "healthy oldest, max s / promise",
            "paused, max s",
            "failing, max s",
            "limited, max s",
            "lost",
            "duplicates",
            "rows left",
            "seconds",
        ],
        rows,
    )
    return lines, targets


def _trouble(name: str, options: dict[str, Any]) -> str:
    cap = options.get("limited_concurrency", 0)
    return TROUBLE[name].format(
        pause=options["pause"],
        fail=options["fail_fraction"],
        retry=options["retry_seconds"],
        calls=options["limited_calls"],
        s="" if options["limited_calls"] == 1 else "s",
        events=options["limited_calls"] * options["consumer_batch_size"],
        cap=f"at most {cap} group in flight" if cap else "no cap on groups in flight",
    )


def fanout(results: Results) -> Rendered:
    """One database's run: the pace, the pause, each consumer's records and ages, the kills."""
    data = results.data
    options, pause, source = data["options"], data["pause"], data["source"]["age"]
    lines = [
        f"{_database(data)} ({data['server']}); `outbox work --processes "
        f"{options['processes']} --concurrency {options['concurrency']}`, batches of "
        f"{options['batch_size']:,} (the fan-out) and {options['consumer_batch_size']:,} (each "
        f"consumer), {len(data['kills'])} SIGKILLs of its workers.",
        "",
        f"- Written: {count(data['written'])} events in {data['write_seconds']:,g} s "
        f"({options['rate']:,g} a second asked; the writer was at most "
        f"{pause['writer_most_behind_seconds']:g} s behind its pace).",
        f"- The paused consumer was resumed at {_seconds(pause['resumed_at'])} s, after a pause "
        f"of {pause['seconds']:,g} s; the healthy consumer had every event at "
        f"{_seconds(pause['healthy_done_at'])} s.",
        f"- The fan-out's own buffer: oldest event at most {source['max']:,g} s (p95 "
        f"{source['p95']:,g} s).",
        f"- Every buffer empty {data['seconds']:,g} s after the writer began; rows left "
        + ", ".join(f"{name} {left}" for name, left in data["left"].items())
        + f"; {data['dead_letters']} dead letters; `outbox work` stopped with "
        f"{data['work_exit']}" + _load(data) + ".",
        "",
    ]
    lines += table(
        [
            "consumer",
            "its trouble",
            "handed",
            "distinct",
            "lost",
            "duplicates",
            "calls",
            "failed calls",
            "calls past a first attempt",
            "most attempts (at s)",
            "oldest, max s (at s)",
            "oldest, p95 s",
            "staleness",
            "last call at s",
        ],
        [
            [
                name,
                _trouble(name, options),
                count(found["handed"]),
                count(found["distinct"]),
                count(found["lost"]),
                count(found["duplicates"]),
                count(found["calls"]),
                count(found["failed_calls"]),
                count(found["calls_past_first_attempt"]),
                f"{found['most_attempts']} ({_seconds(found['most_attempts_at'])})",
                f"{found['age']['max']:,.1f} ({_seconds(found['age']['max_at'])})",
                f"{found['age']['p95']:,.1f}",
                f"{found['age']['staleness']:.2f}",
                _seconds(found["last_call_at"]),
            ]
            for name, found in data["consumers"].items()
        ],
    )
    lines += table(
        ["kill", "worker pid", "progress", "at s"],
        [
            [str(n + 1), str(kill["pid"]), f"{kill['progress']:.0%}", f"{kill['seconds']:,g}"]
            for n, kill in enumerate(data["kills"])
        ],
    )
    return lines, []


def _load(data: dict[str, Any]) -> str:
    load = data.get("load_average")
    if not load:
        return ""
    return (
        f"; the machine's load average {load['start']:g} at the start, {load['end']:g} at the end"
    )
