"""The hot statements compile to the intended SQL on each dialect.

Statements are captured with SQLAlchemy's mock engine, which compiles without a database; the
integration tier checks the same shapes as actually sent to PostgreSQL.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import create_mock_engine

from outbox._db import queries
from tests.models import ActivityEvent

URLS = {"postgresql": "postgresql+psycopg://", "sqlite": "sqlite://", "mysql": "mysql+pymysql://"}


class _Result:
    """What the captured statements get back: two ids to update, no returned rows."""

    rowcount = 0

    def __iter__(self) -> Iterator[Any]:
        return iter(())

    def scalars(self) -> list[int]:
        return [1, 2]

    def all(self) -> list[Any]:
        return []

    def scalar(self) -> str:
        return "r"  # pg_class.relkind of a plain table: the claim may address rows by ctid


def capture(dialect: str, call: str) -> list[str]:
    """The SQL one function of ``queries`` sends on ``dialect``, one string per statement."""
    sent: list[Any] = []

    def executor(statement: Any, *args: Any, **kwargs: Any) -> _Result:
        sent.append(statement)
        return _Result()

    engine = create_mock_engine(URLS[dialect], executor)
    if call == "claim_rows":
        queries.claim_rows(engine, dialect, ActivityEvent.__table__, uuid.uuid4(), 100)  # type: ignore[arg-type]
    else:
        queries.acquire_jobs(
            engine,  # type: ignore[arg-type]
            dialect,
            handlers=["sync"],
            worker_id="w",
            token=uuid.uuid4(),
            limit=4,
            lease_seconds=60.0,
        )
    compiled = [" ".join(str(s.compile(dialect=engine.dialect)).split()) for s in sent]
    # The claim asks PostgreSQL once per engine and table whether the table is partitioned.
    return [sql for sql in compiled if not sql.startswith("SELECT relkind FROM pg_class")]


@pytest.mark.parametrize("call", ["claim_rows", "acquire_jobs"])
def test_postgresql_is_one_statement(call: str) -> None:
    """On PostgreSQL the pick and the update are one statement."""
    assert 1 == len(capture("postgresql", call))


@pytest.mark.parametrize("call", ["claim_rows", "acquire_jobs"])
def test_postgresql_picks_in_a_cte_with_skip_locked(call: str) -> None:
    """On PostgreSQL the pick is a CTE locked FOR UPDATE SKIP LOCKED."""
    (sql,) = capture("postgresql", call)
    assert (True, True) == (
        sql.startswith("WITH "),
        "LIMIT" in sql and "FOR UPDATE SKIP LOCKED)" in sql,
    )


@pytest.mark.parametrize(
    ("call", "update_from"),
    [
        (
            "claim_rows",
            "UPDATE test_activity_events SET group_id=%(group_id)s::UUID"
            " WHERE ctid = ANY (array((SELECT claimable.ctid FROM claimable)))",
        ),
        ("acquire_jobs", "FROM picked WHERE outbox_jobs.id = picked.id"),
    ],
)
def test_postgresql_updates_from_the_cte(call: str, update_from: str) -> None:
    """On PostgreSQL the update takes the CTE's rows: the claim by address, jobs by a join."""
    (sql,) = capture("postgresql", call)
    assert update_from in sql


@pytest.mark.parametrize("call", ["claim_rows", "acquire_jobs"])
def test_postgresql_never_uses_in_subquery(call: str) -> None:
    """On PostgreSQL the pick is never an IN (SELECT ... LIMIT) that the planner may re-run."""
    (sql,) = capture("postgresql", call)
    assert "IN (SELECT" not in sql


def test_postgresql_claim_orders_oldest_first() -> None:
    """The claim picks unclaimed rows by id, so the oldest events go first."""
    (sql,) = capture("postgresql", "claim_rows")
    assert (
        "WHERE test_activity_events.group_id IS NULL ORDER BY test_activity_events.id LIMIT" in sql
    )


def test_postgresql_acquire_orders_by_priority_then_due_time() -> None:
    """Jobs are picked by priority, then due time, then id."""
    (sql,) = capture("postgresql", "acquire_jobs")
    assert "ORDER BY outbox_jobs.priority, outbox_jobs.run_at, outbox_jobs.id LIMIT" in sql


@pytest.mark.parametrize("call", ["claim_rows", "acquire_jobs"])
def test_sqlite_never_asks_for_row_locks(call: str) -> None:
    """SQLite has no row locks; its claims rely on BEGIN IMMEDIATE instead."""
    assert [] == [sql for sql in capture("sqlite", call) if "FOR UPDATE" in sql]


@pytest.mark.parametrize("call", ["claim_rows", "acquire_jobs"])
def test_mysql_selects_ids_with_skip_locked_then_updates_by_id(call: str) -> None:
    """MariaDB/MySQL: SELECT ... FOR UPDATE SKIP LOCKED, then UPDATE by a list of ids."""
    select_sql, update_sql, *_ = capture("mysql", call)
    assert (True, True) == (
        select_sql.startswith("SELECT") and select_sql.endswith("FOR UPDATE SKIP LOCKED"),
        update_sql.startswith("UPDATE") and "IN (__[POSTCOMPILE_id_1])" in update_sql,
    )


@pytest.mark.parametrize("call", ["claim_rows", "acquire_jobs"])
def test_mysql_never_limits_inside_in(call: str) -> None:
    """MariaDB refuses LIMIT inside IN (...); no statement may contain it."""
    assert [] == [sql for sql in capture("mysql", call) if "IN (SELECT" in sql]


@pytest.mark.parametrize("dialect", ["postgresql", "sqlite"])
def test_buffer_indexes_are_partial_so_an_event_write_touches_only_the_unclaimed_one(
    dialect: str,
) -> None:
    """Writing an event adds entries to the primary key and ``ix_<t>_unclaimed`` only; a claim
    moves it to ``ix_<t>_group_id``."""
    from sqlalchemy.schema import CreateIndex

    engine = create_mock_engine(URLS[dialect], lambda *a, **k: None)
    created = sorted(
        str(CreateIndex(index).compile(dialect=engine.dialect)).split(" ON ")[1]
        for index in ActivityEvent.__table__.indexes
    )
    assert [
        "test_activity_events (group_id) WHERE group_id IS NOT NULL",
        "test_activity_events (id) WHERE group_id IS NULL",
    ] == created
