"""A flag handler's readings: the flagged rows of a business table and those its buffer holds
no key of, and the keys dead groups hold, each counted no further than a cap."""

from __future__ import annotations

import uuid
from typing import Any, cast

from sqlalchemy import Table, insert

from outbox import schema
from outbox._db import queries
from outbox.flags import flag_source
from tests.conformance._database import Database
from tests.conformance._factories import HANDLER, OTHER_HANDLER
from tests.models import Employee, EmployeeWork

EMPLOYEES = cast(Table, Employee.__table__)
WORK = cast(Table, EmployeeWork.__table__)
FLAGGED = flag_source(Employee, "needs_work_done", "version").flagged()


def _employees(db: Database, flagged: range, calm: range = range(0)) -> None:
    rows = [{"id": n, "name": f"e{n}", "needs_work_done": True} for n in flagged]
    rows += [{"id": n, "name": f"e{n}", "needs_work_done": False} for n in calm]
    db.run(lambda conn: conn.execute(insert(EMPLOYEES), rows))


def _taken(db: Database, row_ids: list[int]) -> None:
    """Keys in the buffer, as a distribution writes them."""
    rows = [{"row_id": n, "seen": "1"} for n in row_ids]
    db.run(lambda conn: conn.execute(insert(WORK), rows))


def _count(db: Database, cap: int | None) -> queries.FlaggedCount:
    return db.run(lambda conn: queries.count_flagged_rows(conn, WORK, EMPLOYEES, FLAGGED, cap))


def test_flagged_rows_are_counted_and_those_without_a_key_are_waiting(db: Database) -> None:
    """Six flagged rows of nine, two of them with a key in the buffer (and a key of a row no
    longer flagged, which counts for neither): six flagged, four waiting."""
    _employees(db, range(1, 7), calm=range(7, 10))
    _taken(db, [2, 5, 8])
    assert queries.FlaggedCount(flagged=6, waiting=4) == _count(db, None)


def test_past_the_cap_the_highest_keys_are_counted(db: Database) -> None:
    """Ten flagged rows, the four lowest taken (as the distribution takes them): capped at
    five, the five highest are walked, all waiting; capped at eight, two of them taken."""
    _employees(db, range(1, 11))
    _taken(db, [1, 2, 3, 4])
    assert (
        queries.FlaggedCount(flagged=5, waiting=5),
        queries.FlaggedCount(flagged=8, waiting=6),
        queries.FlaggedCount(flagged=10, waiting=6),
    ) == (_count(db, 5), _count(db, 8), _count(db, 100))


def test_no_flagged_row_counts_nothing(db: Database) -> None:
    """A table with no flagged row: nothing flagged, nothing waiting."""
    _employees(db, range(0), calm=range(1, 4))
    assert queries.FlaggedCount(flagged=0, waiting=0) == _count(db, 10)


def test_held_keys_are_counted_per_handler_up_to_the_cap(db: Database) -> None:
    """Three keys held for the handler, one for another: three, or two under a cap of two."""
    rows: list[dict[str, Any]] = [
        {"handler": HANDLER, "key": key, "group_id": uuid.uuid4()} for key in ("1", "2", "3")
    ]
    rows.append({"handler": OTHER_HANDLER, "key": "1", "group_id": uuid.uuid4()})
    db.run(lambda conn: conn.execute(insert(schema.held_keys), rows))
    assert (3, 2, 0) == (
        db.run(lambda conn: queries.count_held_keys(conn, HANDLER, None)),
        db.run(lambda conn: queries.count_held_keys(conn, HANDLER, 2)),
        db.run(lambda conn: queries.count_held_keys(conn, "nobody", 5)),
    )
