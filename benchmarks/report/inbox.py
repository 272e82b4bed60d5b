"""The inbox's proof: deliveries through RabbitMQ with repeats and killed consumers, per
database: effects against distinct ids, the handler's runs, the rate, the prune."""

from __future__ import annotations

from typing import Any

from benchmarks.report._format import DASH, Rendered, Results, Target, count, table

BENCHMARK = "inbox"


def _database(results: Results) -> str:
    names = {"postgresql": "PostgreSQL", "mariadb": "MariaDB", "sqlite": "SQLite"}
    database = str(results.data["database"])
    return names.get(database, database)


def _between(data: dict[str, Any]) -> int:
    return sum(1 for kill in data["kills"] if kill["between_commit_and_ack"])


def inbox_group(files: list[Results]) -> Rendered:
    """One row per database, and the target that each meets or not: no effect lost, none had
    twice."""
    rows, targets = [], []
    for results in files:
        data = results.data
        deliveries, effects = data["deliveries"], data["effects"]
        rows.append(
            [
                _database(results),
                count(data["published"]["messages"]),
                count(deliveries["handled"]),
                f"{count(deliveries['redeliveries'])} ({deliveries['repeat_fraction']:.1%})",
                count(deliveries["redelivered_flag"]),
                f"{len(data['kills'])} ({_between(data)})",
                count(deliveries["handler_runs"]),
                count(effects["effect_rows"]),
                count(effects["distinct_ids_published"]),
                count(effects["lost"]),
                count(effects["ids_with_two_effects"]),
                f"{data['seconds']:,.0f}",
                count(data["deliveries_per_second"]),
                count(data["prune"]["ids_per_second"]),
            ]
        )
        lost, twice = effects["lost"], effects["ids_with_two_effects"]
        targets.append(
            Target(
                BENCHMARK,
                f"{_database(results)}: {count(deliveries['handled'])} deliveries, a fifth "
                "repeated, consumers killed: no effect lost, none twice",
                f"{lost} lost, {twice} twice",
                lost == 0 and twice == 0 and effects["extra_effect_rows"] == 0,
            )
        )
    lines = [
        "Messages published to RabbitMQ (a fifth of them repeating an id published before), "
        "consumed by processes that take batches of up to the prefetch and handle each in one "
        "transaction (`inbox.receive_many`, one effect row per new id into a table with no "
        "unique constraint, commit, then ack); consumers SIGKILLed at random, half of the kills "
        "aimed between a commit and its ack. Deliveries are those whose transaction committed; "
        "re-deliveries, those of an id delivered before (the publisher's repeats and the "
        "broker's redeliveries); kills in brackets, those between a commit and its ack. "
        "Consumers, publisher, broker and database share the machine's CPUs, with whatever "
        "else runs on it: the rates are lower bounds of what the consumers alone would do.",
        "",
    ]
    lines += table(
        [
            "database",
            "published",
            "deliveries",
            "re-deliveries",
            "`redelivered` flag",
            "kills",
            "handler runs",
            "effect rows",
            "distinct ids",
            "lost",
            "twice",
            "seconds",
            "deliveries/s",
            "prune, ids/s",
        ],
        rows,
    )
    return lines, targets


def _gaps(gaps: dict[str, Any], keys: tuple[str, ...]) -> str:
    return ", ".join(
        f"{key} {DASH if gaps.get(key) is None else f'{gaps[key]:,g} s'}" for key in keys
    )


def _load(data: dict[str, Any]) -> str:
    load = data.get("load_average")
    if not load:
        return ""
    return (
        f"; the machine's load average {load['start']:g} at the start, {load['end']:g} at the end"
    )


def inbox(results: Results) -> Rendered:
    """One database's run: what was published, delivered and killed, and the prune."""
    data = results.data
    published, deliveries, prune = data["published"], data["deliveries"], data["prune"]
    options = data["options"]
    kills = data["kills"]
    gaps = deliveries["repeat_gap_seconds"]
    lines = [
        f"{_database(results)} ({data['server']}); {options['consumers']} consumers, prefetch "
        f"{options['prefetch']}, {len(kills)} SIGKILLs ({_between(data)} between a commit and "
        f"its ack, each a batch held {options['hold']:g} s unacknowledged), a replacement "
        "started after each.",
        "",
        f"- Published: {count(published['messages'])} messages, {count(published['distinct'])} "
        f"distinct ids and {count(published['repeats'])} repeats, in {published['seconds']:,g} "
        "s; a repeat published after its first copy by "
        + _gaps(published["repeat_gap_seconds"], ("min", "p10", "p50", "p90", "max"))
        + f" ({count(published['repeat_gap_seconds'].get('over_a_minute', 0))} a minute or "
        "more).",
        f"- Delivered: {count(deliveries['handled'])} deliveries in "
        f"{count(deliveries['batches'])} batches (mean {deliveries['mean_batch']:,g}), "
        f"{count(deliveries['redeliveries'])} of them re-deliveries: "
        f"{count(deliveries['published_repeats'])} of published repeats, "
        f"{count(deliveries['redelivered_flag'])} marked `redelivered` by the broker "
        f"({count(deliveries['redelivered_without_effect'])} of them of a batch committed "
        "before its consumer was killed: no effect). A repeat without effect came after its "
        "first copy's publication by " + _gaps(gaps, ("min", "mean", "max")) + f" "
        f"({count(gaps['over_a_minute'])} a minute or more).",
        f"- The handler ran {count(deliveries['handler_runs'])} times; "
        f"{count(deliveries['without_effect'])} deliveries had no effect; "
        f"{count(deliveries['transaction_retries'])} transactions retried after a deadlock or "
        "a lock timeout.",
        f"- {data['seconds']:,g} s from the start to the last commit: "
        f"{count(data['deliveries_per_second'])} deliveries/s; the publisher, beside the "
        f"consumers, took {published['seconds']:,g} s (where the two are close, the consumers "
        "kept pace with it and the rate is the publisher's)" + _load(data) + ".",
        f"- Prune: every id put past its horizon in {prune['expire_seconds']:,g} s (one "
        f"UPDATE), then `outbox.inbox.prune` deleted {count(prune['deleted'])} ids "
        f"({count(prune['chunk'])} a transaction) in {prune['seconds']:,g} s: "
        f"{count(prune['ids_per_second'])} ids/s; {count(prune['left'])} left.",
        "",
    ]
    lines += table(
        ["kill", "consumer", "after deliveries", "at s", "aimed", "between commit and ack"],
        [
            [
                str(n + 1),
                kill["consumer"],
                count(kill["at_deliveries"]),
                f"{kill['seconds']:,g}",
                "yes" if kill["aimed"] else "no",
                "yes" if kill["between_commit_and_ack"] else "no",
            ]
            for n, kill in enumerate(kills)
        ],
    )
    return lines, []
