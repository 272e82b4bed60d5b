"""Claims on MariaDB: at READ COMMITTED a claim in progress never blocks the application's
writes; at MariaDB's default, REPEATABLE READ, its locking read locks the gaps of the index it
scans, and an application's INSERT waits behind it (the trap outbox's isolation avoids)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import Connection, Engine, create_engine, insert, text
from sqlalchemy.exc import OperationalError

from outbox import Outbox
from outbox._db.queries import claim_rows
from tests.conftest import reset_schema
from tests.models import ActivityEvent

TABLE = ActivityEvent.__table__


@pytest.fixture
def mariadb(mariadb_url: str) -> str:
    """The session's MariaDB database, reset to empty tables for one test."""
    reset_schema(mariadb_url)
    return mariadb_url


@pytest.fixture
def application(mariadb: str) -> Iterator[Engine]:
    """The application's engine, as an application creates it: MariaDB's default isolation."""
    engine = create_engine(mariadb)
    yield engine
    engine.dispose()


def _write_events(engine: Engine, count: int) -> None:
    with engine.begin() as conn:
        conn.execute(insert(TABLE), [{"activity_id": n} for n in range(count)])


def _insert_waits(engine: Engine) -> bool:
    """Whether an application's INSERT of one event waits for a lock (given up after 1 s)."""
    with engine.connect() as conn:
        conn.execute(text("SET SESSION innodb_lock_wait_timeout = 1"))
        try:
            conn.execute(insert(TABLE).values(activity_id=99))
        except OperationalError as error:
            if error.orig.args[0] != 1205:  # lock wait timeout exceeded
                raise
            return True
        conn.commit()
        return False


def _while_claiming(engine: Engine, then: Callable[[], bool]) -> bool:
    """Claim every waiting event in a transaction left open while ``then`` runs."""
    with engine.connect() as conn:
        assert 3 == claim_rows(conn, "mysql", TABLE, uuid.uuid4(), limit=10)
        try:
            return then()
        finally:
            conn.rollback()


def test_an_open_claim_does_not_block_the_applications_insert(
    mariadb: str, application: Engine
) -> None:
    """With outbox's own engine (READ COMMITTED), the INSERT goes through at once."""
    _write_events(application, 3)
    app = Outbox(mariadb)
    try:
        waited = _while_claiming(app.engine, lambda: _insert_waits(application))
    finally:
        app.engine.dispose()
    assert False is waited


def test_at_repeatable_read_an_open_claim_blocks_the_applications_insert(
    mariadb: str, application: Engine
) -> None:
    """The trap: the same claim at REPEATABLE READ makes the INSERT wait for its commit."""
    _write_events(application, 3)
    waited = _while_claiming(application, lambda: _insert_waits(application))
    assert True is waited


def test_outbox_on_an_application_engine_claims_at_read_committed(
    application: Engine,
) -> None:
    """Given the application's engine (REPEATABLE READ), outbox's transactions are READ
    COMMITTED; the application's own stay as they were."""

    def isolation(conn: Connection) -> str:
        return str(conn.execute(text("SELECT @@session.tx_isolation")).scalar())

    app = Outbox(engine=application)
    with app.engine.connect() as conn:
        outbox_level = isolation(conn)
    with application.connect() as conn:
        application_level = isolation(conn)
    assert ("READ-COMMITTED", "REPEATABLE-READ") == (outbox_level, application_level)
