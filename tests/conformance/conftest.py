"""Fixtures of the conformance suite: every operation of outbox's database layer
(``outbox._db.queries``, and the clock each database's package renders) on every database it
runs on.

A database is supported exactly when this suite passes on it. Each test takes ``db``, a
migrated, empty database of each kind (SQLite, PostgreSQL, MariaDB) with an outbox engine, and
opens a second real session wherever isolation or locking matters. A behaviour that only some
databases offer is skipped by asking what the database supports (``outbox._db.dialects``), never
by its name.

The tables are created afresh (``tests.conftest.reset_schema``) by the first test of each
module on each database, and emptied of rows before every later one: the same empty tables,
at a fraction of the cost of creating them for each of the suite's hundreds of tests.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import delete

from outbox import schema
from tests.conformance._database import Database
from tests.conformance._factories import TYPED, TypedBase
from tests.conftest import reset_schema
from tests.models import Base

DATABASES = ("sqlite", "postgresql", "mariadb")

_TABLES = [*schema.metadata.sorted_tables, *Base.metadata.sorted_tables]


@pytest.fixture(scope="module")
def _sqlite_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A SQLite file for one module's tests."""
    path: Path = tmp_path_factory.mktemp("conformance") / "outbox.sqlite3"
    return f"sqlite:///{path}"


@pytest.fixture(scope="module")
def _created() -> set[str]:
    """The databases whose tables this module has created."""
    return set()


@pytest.fixture(params=DATABASES)
def db(request: pytest.FixtureRequest, _created: set[str]) -> Iterator[Database]:
    """A migrated, empty database of each kind, with an outbox engine; every engine made for
    the test is disposed at its end."""
    name = {"sqlite": "_sqlite_url", "postgresql": "postgres_url", "mariadb": "mariadb_url"}
    url: str = request.getfixturevalue(name[request.param])
    if url not in _created:
        reset_schema(url)
        _created.add(url)
    database = Database.open(url)
    try:
        with database.engine.begin() as conn:
            for table in reversed(_TABLES):
                conn.execute(delete(table))
        yield database
    finally:
        database.close()


@pytest.fixture
def typed_buffer(db: Database) -> Iterator[Database]:
    """``db`` with the buffer of :class:`tests.conformance._factories.TypedEvent`."""
    with db.engine.begin() as conn:
        TypedBase.metadata.drop_all(conn)
        TypedBase.metadata.create_all(conn)
    try:
        yield db
    finally:
        with db.engine.begin() as conn:
            TYPED.drop(conn, checkfirst=True)


@pytest.fixture
def row_locks(db: Database) -> Database:
    """``db`` where writers lock rows and skip those locked: PostgreSQL and MariaDB."""
    if not db.row_locks:
        pytest.skip(f"{db.dialect} has no row locks: one writer holds the whole database")
    return db


@pytest.fixture
def single_writer(db: Database) -> Database:
    """``db`` where one write lock covers the whole database, taken at BEGIN: SQLite."""
    if db.row_locks:
        pytest.skip(f"{db.dialect} locks rows, not the whole database")
    return db
