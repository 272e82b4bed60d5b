"""``outbox flags list`` and the flag handlers in ``outbox status``: what the operator runs to see
the rows flagged on a business table, and how many wait to be taken into the handler's
buffer."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from tests.acceptance._cli import Cli
from tests.models import Employee

APP = "tests.acceptance.flags_app:app"
FLAG = "test_employees.needs_work_done"
BUFFER = "test_employee_work"
pytestmark = pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)


def _hire(engine: Engine, flagged: int, calm: int = 0) -> None:
    with Session(engine) as session, session.begin():
        session.add_all(
            Employee(id=n, name=f"e{n}", needs_work_done=n <= flagged)
            for n in range(1, flagged + calm + 1)
        )


def test_flags_list_shows_the_rows_flagged_and_those_not_taken_yet(
    cli: Cli, database_url: str, connect: Callable[[str], Engine]
) -> None:
    """60 employees flagged of 64, then a distribution (50 taken, groups of one): the table
    has the handler's flag, version and buffer with 60 flagged, 10 not taken, 50 keys in the
    buffer; the JSON the same counts, with the cap."""
    _hire(connect(database_url), 60, calm=4)
    given = ("--app", APP, "--database-url", database_url)

    distributed = cli.run(*given, "distribute")
    table = cli.run(*given, "flags", "list")
    listed = cli.run(*given, "flags", "list", "--json")

    [found] = json.loads(listed.stdout)
    assert (
        0,
        0,
        [
            ["handler", "flag", "version", "buffer", "flagged", "not", "taken", "in", "buffer",
             "held"],
            ["sync_payroll", FLAG, "version", BUFFER, "60", "10", "50", "0"],
            ["1", "flag", "handler"],
        ],
        0,
        {"handler": "sync_payroll", "table": "test_employees", "flag": "needs_work_done",
         "version": "version", "buffer": BUFFER, "flagged": 60, "waiting": 10, "taken": 50,
         "keys": 50, "held": 0, "capped_at": 100_000, "error": None},
    ) == (
        distributed.code,
        table.code,
        [line.split() for line in table.stdout.splitlines() if set(line) != {"-", " "}],
        listed.code,
        found,
    )  # fmt: skip


def test_status_has_a_line_per_flag_handler_narrowed_by_handler(
    cli: Cli, database_url: str, connect: Callable[[str], Engine]
) -> None:
    """Three rows flagged, none taken: a line saying so; the JSON has a ``flags`` list as
    ``flags list --json``; narrowed to another handler, neither."""
    _hire(connect(database_url), 3)
    given = ("--app", APP, "--database-url", database_url, "status")

    text = cli.run(*given)
    document = cli.run(*given, "--json")
    other = cli.run(*given, "--handler", "activity", "--json")

    [line] = [line for line in text.stdout.splitlines() if line.startswith("flags ")]
    [found] = json.loads(document.stdout)["flags"]
    assert (
        0,
        f"flags sync_payroll: {FLAG} (version version): 3 flagged, 3 not taken into {BUFFER} yet",
        0,
        ("sync_payroll", 3, 3),
        0,
        [],
    ) == (
        text.code,
        line,
        document.code,
        (found["handler"], found["flagged"], found["waiting"]),
        other.code,
        json.loads(other.stdout)["flags"],
    )
