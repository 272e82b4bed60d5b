"""Retention of the archive: a day taken out of a partitioned archive against today's prune,
and the job table's dead tuples."""

from __future__ import annotations

from typing import Any

from benchmarks.report._format import Rendered, Results, table


def _locks(step: dict[str, Any]) -> str:
    found = step["longest_locks"]
    if not found:
        return "none seen"
    return "; ".join(
        f"{mode.removesuffix('Lock')} {held['seconds'] * 1000:,.0f} ms on `{held['relation']}`"
        for mode, held in found.items()
    )


def _state(state: dict[str, Any] | None) -> str:
    if state is None:
        return "-"
    return (
        f"{state['heap_mib']:,.1f} / {state['indexes_mib']:,.1f} MiB, "
        f"{state['live_tuples']:,} live, {state['dead_tuples']:,} dead"
    )


def retention(results: Results) -> Rendered:
    """Each step's wall time, the longest lock seen per mode, sizes and tuples before and
    after, and the dead letters of the day before and after; the job table's churn."""
    data = results.data
    lines = [
        f"{data['rows']:,} archive rows over {data['days']} UTC days, generated in the database; "
        "one in a hundred rows of every other day a dead letter. `plain`: the archive as one "
        "table; `partitioned`: as migration 0010 makes it. The first two days go: by `prune`'s "
        "deletes (then a VACUUM), and by retention's statement for a day past its age (a truncate "
        "of the history leaf for the day with dead letters, a drop for the day without). Locks: "
        "the longest seen held on an `outbox_archive*` relation per mode, polled every 2 ms from "
        "a second connection (a shorter one may go unseen). Sizes: heap / indexes of every leaf, "
        "tuples from `pg_stat_user_tables`. No target is set.",
        "",
        f"Load average at the start: {', '.join(data.get('load_at_start', []))}.",
        "",
    ]
    body = []
    archives = [a for a in ("plain", "partitioned") if data.get(a)]
    for archive in archives:
        for step in data[archive]["steps"]:
            outcome = step.get("outcome")
            outcome = outcome if isinstance(outcome, dict) else {}
            kept = step.get("dead_letters")
            body.append(
                [
                    f"`{archive}`",
                    step.get("day", "-"),
                    step["what"]
                    + (
                        f" ({outcome['retired']}; its transaction, the longest its locks can be "
                        f"held: {outcome['transaction_seconds']:.3f} s)"
                        if "retired" in outcome
                        else ""
                    ),
                    f"{step['seconds']:,.3f}",
                    _locks(step),
                    _state(step.get("before")),
                    _state(step["after"]),
                    "-" if kept is None else f"{kept[0]:,} → {kept[1]:,}",
                ]
            )
    header = ["archive", "day", "step", "seconds", "longest locks", "before", "after",
              "dead letters of the day"]  # fmt: skip
    lines += table(header, body)
    fills = ", ".join(f"{a} {data[a]['fill_seconds']:,} s" for a in archives)
    lines += [f"Generating the rows took: {fills}.", ""]
    jobs = data["partitioned"].get("jobs")
    if jobs:
        lines += [
            f"The job table: {jobs['jobs']:,} batch jobs inserted and deleted a thousand at a "
            f"time (autovacuum off) in {jobs['churn_seconds']} s left "
            f"{jobs['after_churn']['dead_tuples']:,} dead tuples, a heap of "
            f"{jobs['after_churn']['heap_kib']:,} KiB and indexes of "
            f"{jobs['after_churn']['indexes_kib']:,} KiB for "
            f"{jobs['after_churn']['live_tuples']:,} live rows; a VACUUM took "
            f"{jobs['vacuum_seconds']} s and left a heap of {jobs['after_vacuum']['heap_kib']:,} "
            f"KiB (indexes {jobs['after_vacuum']['indexes_kib']:,} KiB); the same churn again: "
            f"heap {jobs['after_second_churn']['heap_kib']:,} KiB, indexes "
            f"{jobs['after_second_churn']['indexes_kib']:,} KiB.",
            "",
        ]
    maria = data.get("mariadb")
    if maria:
        lines += [
            f"MariaDB (`{data.get('mariadb_command', data['command'])}`): "
            f"{maria['rows']:,} rows archived over the week before migration 0010, which took "
            f"{maria['migration_0010_seconds']} s (one copy of the table, its writers waiting); "
            f"then {maria['rows']:,} rows over the next days. Sizes: InnoDB's estimates "
            "(`information_schema.PARTITIONS`, after ANALYZE); a DDL holds the metadata lock "
            "for its whole statement.",
            "",
        ]

        def sizes(state: dict[str, Any]) -> str:
            return (
                f"{state['data_mib']:,.1f} / {state['indexes_mib']:,.1f} MiB, "
                f"{state['rows_estimated']:,} rows, {state['partitions']} partitions"
            )

        rows = []
        for step in maria["steps"]:
            kept = step.get("dead_letters")
            rows.append(
                [
                    step["day"],
                    step["what"],
                    f"{step['seconds']:,.3f}",
                    sizes(step["before"]),
                    sizes(step["after"]),
                    "-" if kept is None else f"{kept[0]:,} → {kept[1]:,}",
                ]
            )
        lines += table(
            ["day", "step", "seconds", "before", "after", "dead letters of the day"], rows
        )
    return lines, []


def retention_migration(results: Results) -> Rendered:
    """PostgreSQL's migrations 0009 and 0010 under traffic: each revision's time, the longest
    lock seen per mode, and the longest a writer and a reader waited meanwhile."""
    data = results.data["migration"]
    lines = [
        f"{data['rows']:,} archive rows over the week before, generated in the database; then "
        "`outbox migrate` to 0009, and to 0010, each timed, while a writer archives a row and a "
        "reader reads the newest one every 5 ms on connections of their own. Locks: the "
        "longest seen held on an `outbox_archive*` relation per mode (polled every 2 ms; a "
        "shorter one may go unseen).",
        "",
        f"Load average at the start: {', '.join(results.data.get('load_at_start', []))}.",
        "",
    ]
    body = []
    for step in data["steps"]:
        traffic = step["traffic"]
        body.append(
            [
                step["revision"],
                f"{step['seconds']:,.3f}",
                _locks(step),
                f"{traffic['longest_insert_seconds'] * 1000:,.0f} ms ({traffic['inserts']:,} rows)",
                f"{traffic['longest_read_seconds'] * 1000:,.0f} ms ({traffic['reads']:,} reads)",
                "; ".join(traffic["errors"]) or "none",
            ]
        )
    header = ["revision", "seconds", "longest locks", "writer's longest wait",
              "reader's longest wait", "errors"]  # fmt: skip
    lines += table(header, body)
    lines += [
        f"Generating the rows took {data['fill_seconds']:,} s; rows in the archive after: "
        f"{data['rows_after']:,} (the rows before, and every row the writer archived).",
        "",
    ]
    return lines, []
