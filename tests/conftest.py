"""Fixtures shared by every tier: real PostgreSQL, MariaDB and SQLite databases.

PostgreSQL and MariaDB tests run in a database of their own, created for the test session and
dropped at its end. When a server cannot be reached its tests are skipped on a developer's
machine, but fail loudly when ``CI=true``: in CI a database test never silently skips.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, func, select, text
from sqlalchemy.engine import make_url

from outbox import Outbox, Settings, add_events, schema
from tests.models import ActivityEvent, Base, EmailEvent
from tests.poolers._pgbouncer import PgBouncer, executable

POSTGRES_URL_ENV = "OUTBOX_TEST_POSTGRES_URL"
DEFAULT_POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
MARIADB_URL_ENV = "OUTBOX_TEST_MARIADB_URL"
DEFAULT_MARIADB_URL = "mysql+pymysql://root@127.0.0.1:3306/test"


def _unavailable(what: str, error: Exception) -> None:
    message = f"{what} is not reachable: {error}"
    if os.environ.get("CI") == "true":
        pytest.fail(f"{message} (CI=true: database tests must not skip)", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """The URL of a PostgreSQL database created for this test session."""
    admin_url = make_url(os.environ.get(POSTGRES_URL_ENV, DEFAULT_POSTGRES_URL))
    name = f"outbox_test_{uuid.uuid4().hex[:10]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as error:
        admin.dispose()
        _unavailable(f"PostgreSQL at {admin_url.host}:{admin_url.port}", error)
    url = admin_url.set(database=name).render_as_string(hide_password=False)
    try:
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(scope="session")
def mariadb_url() -> Iterator[str]:
    """The URL of a MariaDB database created for this test session."""
    admin_url = make_url(os.environ.get(MARIADB_URL_ENV, DEFAULT_MARIADB_URL))
    name = f"outbox_test_{uuid.uuid4().hex[:10]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f"CREATE DATABASE {name} CHARACTER SET utf8mb4"))
    except Exception as error:
        admin.dispose()
        _unavailable(f"MariaDB at {admin_url.host}:{admin_url.port}", error)
    url = admin_url.set(database=name).render_as_string(hide_password=False)
    try:
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {name}"))
        admin.dispose()


def pgbouncer_program() -> str:
    """Where ``pgbouncer`` is installed; skips, or fails when ``CI=true``, when it is not."""
    program = executable()
    if program is None:
        _unavailable("pgbouncer", FileNotFoundError("not installed (apt-get install pgbouncer)"))
    assert program is not None
    return program


@pytest.fixture(scope="session")
def pgbouncer(postgres_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PgBouncer]:
    """A PgBouncer in transaction mode in front of the session's PostgreSQL database,
    configured as it comes: it refuses the ``options`` startup parameter."""
    bouncer = PgBouncer(
        pgbouncer_program(),
        postgres_url,
        tmp_path_factory.mktemp("pgbouncer"),
        ignore_options=False,
    )
    bouncer.start()
    try:
        yield bouncer
    finally:
        bouncer.stop()


@pytest.fixture
def sqlite_url(tmp_path: object) -> str:
    """The URL of a fresh SQLite file."""
    return f"sqlite:///{tmp_path}/outbox.sqlite3"


def reset_schema(url: str) -> None:
    """Drop and create the framework's tables and the test models."""
    engine = create_engine(url)
    with engine.begin() as conn:
        Base.metadata.drop_all(conn)
        schema.metadata.drop_all(conn)
        schema.metadata.create_all(conn)
        Base.metadata.create_all(conn)
    engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql", "mariadb"])
def database_url(request: pytest.FixtureRequest, tmp_path: object) -> str:
    """A migrated database of each kind (SQLite, PostgreSQL, MariaDB), empty, for one test."""
    if request.param == "mariadb":
        url: str = request.getfixturevalue("mariadb_url")
    elif request.param == "postgresql":
        url = request.getfixturevalue("postgres_url")
    else:
        url = f"sqlite:///{tmp_path}/outbox.sqlite3"
    reset_schema(url)
    return url


@pytest.fixture(params=["postgresql", "mariadb"])
def server_database(request: pytest.FixtureRequest) -> str:
    """A migrated database on each database server (PostgreSQL, MariaDB), empty, for one test."""
    url: str = request.getfixturevalue(f"{request.param.replace('postgresql', 'postgres')}_url")
    reset_schema(url)
    return url


@pytest.fixture
def postgres_database(postgres_url: str) -> str:
    """The session's PostgreSQL database, reset to empty tables for one test."""
    reset_schema(postgres_url)
    return postgres_url


@pytest.fixture
def make_app() -> Iterator[Callable[..., Outbox]]:
    """Build Outbox applications on a URL; their engines are disposed after the test."""
    apps: list[Outbox] = []

    def make(url: str, settings: Settings | None = None) -> Outbox:
        app = Outbox(url) if settings is None else Outbox(url, settings=settings)
        apps.append(app)
        return app

    yield make
    for app in apps:
        if app._engine is not None:
            app._engine.dispose()


def _event_columns(model: type[Any], n: int) -> dict[str, Any]:
    if model is EmailEvent:
        return {"address": f"user{n}@example.com"}
    return {"activity_id": n}


@pytest.fixture
def commit_events() -> Callable[..., list[int]]:
    """Factory: commit ``count`` events of a buffer model in one transaction; returns their ids."""

    def commit(
        engine: Engine, count: int, model: type[Any] = ActivityEvent, **columns: Any
    ) -> list[int]:
        rows = [{**_event_columns(model, n), **columns} for n in range(count)]
        with engine.begin() as conn:
            before = conn.execute(select(func.coalesce(func.max(model.id), 0))).scalar_one()
            add_events(conn, model, rows)
            ids = conn.execute(
                select(model.id).where(model.id > before).order_by(model.id)
            ).scalars()
            return list(ids)

    return commit
