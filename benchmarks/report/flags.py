"""The flags proof: the article's employee table handled by killed workers while a writer
changes it, per database: flags left, clears without a success on their state, calls of several
workers at once, retries against the poll interval, the rate."""

from __future__ import annotations

from typing import Any

from benchmarks.report._format import DASH, Rendered, Results, Target, count, table

BENCHMARK = "flags"
# Seconds SQLite's julianday() arithmetic, which dates a retried group, can be off by.
CLOCK_ERROR = 0.005


def _database(results: Results) -> str:
    names = {"postgresql": "PostgreSQL", "mariadb": "MariaDB", "sqlite": "SQLite"}
    database = str(results.data["database"])
    return names.get(database, database)


def _seconds(value: float | None) -> str:
    return DASH if value is None else f"{value:,g} s"


def _retried_in_time(retries: dict[str, Any]) -> bool:
    shortest, policy = retries["shortest_wait"], retries["policy_shortest_wait"]
    return (
        shortest is not None
        and shortest >= policy - CLOCK_ERROR
        and policy > retries["poll_interval"]
        and retries["failures_without_a_later_attempt"] == 0
    )


def flags_group(files: list[Results]) -> Rendered:
    """One row per database, and the targets each meets or not: every flag cleared, each by a
    success on its state; calls of several workers at once; retries no sooner than the
    policy's wait, longer than the poll interval."""
    rows, targets = [], []
    for results in files:
        data = results.data
        employees, clears, calls = data["employees"], data["clears"], data["calls"]
        handed, overlap, retries = data["handed"], data["overlap"], data["retries"]
        name = _database(results)
        rows.append(
            [
                name,
                count(employees["employees"]),
                count(employees["changes_written"]),
                str(len(data["kills"])),
                f"{count(calls['calls'])} ({count(calls['failed'])})",
                count(handed["rows_in_successes"]),
                count(handed["handed_again_after_a_success"]),
                f"{count(employees['flagged'])} ({count(employees['flagged_dead'])})",
                count(clears["logged"]),
                count(clears["without_success"] + employees["unflagged_without_success"]),
                f"{count(overlap['calls_overlapping_another_process'])} "
                f"({overlap['share_of_calls']:.0%})",
                f"{_seconds(retries['shortest_wait'])} ({retries['policy_shortest_wait']:g} s, "
                f"{retries['poll_interval']:g} s)",
                f"{data['seconds']:,.0f}",
                count(data["rows_per_second"]),
            ]
        )
        without = clears["without_success"] + employees["unflagged_without_success"]
        targets += [
            Target(
                BENCHMARK,
                f"{name}: {count(employees['employees'])} flagged employees changed while "
                "handled, workers killed: every flag cleared, none without its handler's "
                "success on the state it cleared",
                f"{employees['flagged_not_dead']} left flagged, {without} of "
                f"{count(clears['logged'])} clears without a success",
                employees["flagged_not_dead"] == 0 and without == 0,
            ),
            Target(
                BENCHMARK,
                f"{name}: calls of several workers at once",
                f"{count(overlap['calls_overlapping_another_process'])} of "
                f"{count(calls['calls'])} calls overlapped one of another process",
                overlap["calls_overlapping_another_process"] > 0,
            ),
            Target(
                BENCHMARK,
                f"{name}: a failed group tried again no sooner than the retry policy's wait, "
                "longer than the poll interval",
                f"shortest {_seconds(retries['shortest_wait'])} (policy "
                f"{retries['policy_shortest_wait']:g} s, poll {retries['poll_interval']:g} s)",
                _retried_in_time(retries),
            ),
        ]
    lines = [
        'The `employee` table of "Using your database as a queue" (`needs_work_done`, a '
        "version moved with every change), all flagged, handled by four `outbox work` "
        "processes through `Outbox.flagged` while a writer keeps changing employees (a new "
        "name, the flag set, the version + 1, in one UPDATE), some of them while outbox holds "
        "them in a claimed group; the handler fails a fifth of its calls (retried after 2 s "
        "±10%, the workers polling every 0.5 s); workers SIGKILLed at random and replaced. "
        "Calls: all, and in brackets the failed ones; flagged left: in brackets, those "
        "dead-lettered; clears: every flag cleared, logged by a trigger with the row's version "
        "and name; without a success: clears, and unflagged employees' final states, that no "
        "recorded success of the handler was handed; overlapping: calls that overlapped a call "
        "of another process; shortest retry: the least time between a failed call and its "
        "group's next attempt (in brackets, the policy's shortest wait and the poll interval): "
        "a group due again then waits its turn among those claimed before it, so that most "
        "waits are longer. Workers, writer and database share the machine's CPUs, with "
        "whatever else runs on it.",
        "",
    ]
    lines += table(
        [
            "database",
            "employees",
            "changes",
            "kills",
            "calls (failed)",
            "rows handed",
            "handed again",
            "flagged left (dead)",
            "clears",
            "without a success",
            "overlapping",
            "shortest retry",
            "seconds",
            "rows/s",
        ],
        rows,
    )
    return lines, targets


def flags(results: Results) -> Rendered:
    """One database's run: the load, what was handed and cleared, overlap, retries, kills."""
    data = results.data
    options, handler = data["options"], data["options"]["handler"]
    employees, clears, calls = data["employees"], data["clears"], data["calls"]
    handed, overlap, retries = data["handed"], data["overlap"], data["retries"]
    writer, kills, load = data["writer"], data["kills"], data.get("load_average") or {}
    lines = [
        f"{_database(results)} ({data['server']}); {options['workers']} `outbox work` "
        f"processes of {options['concurrency']} threads, batch {handler['batch_size']}, a call "
        f"taking {handler['call_seconds']:g} s and failing at random "
        f"{handler['fail_fraction']:.0%} of the time, retried after "
        f"{handler['retry_seconds']:g} s ±{handler['retry_jitter']:.0%} (at most "
        f"{handler['max_attempts']} attempts), the workers polling every "
        f"{handler['poll_interval']:g} s (lease {handler['lease_seconds']:g} s, a silent worker "
        f"gone after {handler['worker_stale_after']:g} s); {len(kills)} SIGKILLs, a new worker "
        "started after each.",
        "",
        f"- Employees: {count(employees['employees'])}, all flagged at the start; the writer "
        f"made {count(writer['changes'])} changes of {count(writer['rows'])} rows in "
        f"{writer['seconds']:,g} s ({count(writer['aimed'])} aimed at employees in a claimed "
        f"group; {count(writer['rows_being_handled'])} rows changed while in one; "
        f"{count(writer['retries'])} transactions retried), "
        f"{count(employees['changes_written'])} versions moved in all.",
        f"- At the end: {count(employees['unflagged'])} unflagged, "
        f"{count(employees['flagged'])} flagged ({count(employees['flagged_dead'])} "
        f"dead-lettered); {count(employees['unflagged_without_success'])} unflagged employees "
        "whose final (id, version, name) no success was handed.",
        f"- Clears: {count(clears['logged'])} flags cleared, "
        f"{count(clears['without_success'])} of them on a state no success was handed.",
        f"- Calls: {count(calls['calls'])} ({count(calls['succeeded'])} succeeded, "
        f"{count(calls['failed'])} failed; {count(calls['calls_in_killed_processes'])} in "
        f"processes killed later), from {calls['processes']} processes, "
        f"{calls['mean_rows']:,g} rows each on average, at most {calls['most_attempts']} "
        "attempts of a group.",
        f"- Handed in successful calls: {count(handed['rows_in_successes'])} rows, "
        f"{count(handed['distinct_states_succeeded'])} distinct (id, version) states of "
        f"{count(handed['employees_succeeded'])} employees "
        f"({count(handed['employees_succeeded_at_several_versions'])} at several versions); "
        f"{count(handed['handed_again_after_a_success'])} handed again after a success "
        f"({count(handed['of_which_the_first_success_process_was_killed'])} whose first "
        "success's process was killed before its flag was cleared, "
        f"{count(handed['of_which_not'])} of rows changed in a claimed group: handed their new "
        "state, whose flag the group could not clear, and handed it again).",
        f"- Several workers at once: {count(overlap['calls_overlapping_another_process'])} "
        f"calls ({overlap['share_of_calls']:.0%}) overlapped a call of another process; at "
        f"most {overlap['most_processes_in_a_call_at_once']} processes in a call at once; two "
        "or more during "
        f"{overlap['share_of_busy_time_with_two_or_more_processes']:.0%} of the time any was.",
        f"- Retries: {count(retries['failed_calls'])} failed calls; from a failure to its "
        f"group's next attempt, shortest {_seconds(retries['shortest_wait'])}, median "
        f"{_seconds(retries['median_wait'])}, longest {_seconds(retries['longest_wait'])} "
        f"over {count(retries['waits'])} waits (the policy's shortest "
        f"{retries['policy_shortest_wait']:g} s, the poll interval "
        f"{retries['poll_interval']:g} s); "
        f"{count(retries['waits_after_the_failing_worker_was_killed'])} more whose failing "
        "worker was killed before the next attempt (shortest "
        f"{_seconds(retries['shortest_wait_after_a_kill'])}: the group came back with the "
        f"dead worker's jobs); {retries['failures_without_a_later_attempt']} failures with no "
        "later attempt.",
        f"- {data['seconds']:,g} s from starting the workers to the last success "
        f"({data['drain_after_writer_seconds']:,g} s after the writer stopped); every employee "
        f"handed once within {handed['every_employee_handed_once_after_seconds']:,g} s; "
        f"{count(data['rows_per_second'])} rows handed per second"
        + (
            f"; the machine's load average {load['start']:g} at the start, {load['end']:g} at "
            "the end"
            if load
            else ""
        )
        + ".",
        "",
    ]
    lines += table(
        ["kill", "worker", "process", "at s"],
        [
            [str(n + 1), str(kill["slot"]), str(kill["pid"]), f"{kill['seconds']:,g}"]
            for n, kill in enumerate(kills)
        ],
    )
    return lines, []
