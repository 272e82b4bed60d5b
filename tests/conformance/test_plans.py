"""Statements planned for their values: a transaction that asks for it plans each statement
for the values given (PostgreSQL), and the next transaction is as before."""

from __future__ import annotations

import pytest
from sqlalchemy import Connection, text

from outbox._db import dialects
from tests.conformance._database import Database


def test_plan_each_time_lasts_one_transaction(db: Database) -> None:
    """Inside: PostgreSQL plans for the values (``force_custom_plan``); after: its default.
    Elsewhere there are no cached plans to avoid, and the call changes nothing."""
    if db.dialect != dialects.POSTGRESQL:
        db.run(lambda conn: dialects.statements(db.dialect).plan_each_time(conn))
        pytest.skip(f"{db.dialect} keeps no plan past its statement")

    def inside(conn: Connection) -> str:
        dialects.statements(db.dialect).plan_each_time(conn)
        return str(conn.execute(text("SHOW plan_cache_mode")).scalar_one())

    during = db.run(inside)
    with db.engine.connect() as conn:
        after = conn.execute(text("SHOW plan_cache_mode")).scalar_one()
    assert ("force_custom_plan", "auto") == (during, after)
