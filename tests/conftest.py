"""Fixtures shared by every tier: real PostgreSQL, MariaDB and SQLite databases.

PostgreSQL and MariaDB tests run in a database of their own, created for the test session and
dropped at its end. When a server cannot be reached its tests are skipped on a developer's
machine, but fail loudly when ``CI=true``: in CI a database test never silently skips.
"""

from __future__ import annotations

import datetime
import os
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, create_engine, func, select, text
from sqlalchemy.engine import make_url

from outbox import Outbox, Settings, add_events, schema
from outbox._db.mysql import partitions as mysql_partitions
from outbox._db.postgresql import partitions as postgresql_partitions
from tests import _reset
from tests.models import ActivityEvent, Base, EmailEvent
from tests.poolers._pgbouncer import PgBouncer, executable

FULL_RUN_ENV = "OUTBOX_FULL_RUN"
"""``OUTBOX_FULL_RUN=1`` (``nox -s full``) runs what the default run leaves out (see
:func:`pytest_collection_modifyitems`)."""
# Tiers whose every test is the full run's: soaks with a nox session of their own.
_FULL_RUN_PATHS = (
    "tests/upgrade/",
    "tests/sinks/test_kills.py",
    "tests/acceptance/test_bulk_api.py",  # 100,000 events; the figure is drain_rate_limited's
    "tests/model/",  # generated cases and killed processes; nox -s model runs 200 per profile
    # Celery's ticks and redeliveries: a tick's key is the conformance tier's, a duplicate
    # message's no-op tests/executors'; the kill and poison proofs stay in every run.
    "tests/celery_proofs/test_beats.py",
    "tests/celery_proofs/test_redelivery.py",
    # Long runs whose every part a shorter test checks on every run: the chaos tier's smoke run
    # (each fault has its own test in tests/faults), a newcomer's bulk API of every answer (the
    # sinks' contract), 100,000 events through PgBouncer under a rate limit (the limit's
    # windows: tests/acceptance/test_rate_limit_processes.py).
    "tests/faults/test_chaos.py",
    "tests/acceptance/test_newcomer_bulk_api.py",
    "tests/poolers/test_pgbouncer_flow_control.py::test_a_hundred_thousand_events",
    # 1,000,000 deliveries per database through RabbitMQ (benchmarks/inbox.py's full size); the
    # same proof at 20,000 runs on every run.
    "tests/inbox/test_proof.py::test_a_million_deliveries_have_no_second_effect",
    # 50,000 employees per database through kills (benchmarks/flags.py's full size); the same
    # proof at 3,000 runs on every run.
    "tests/flags/test_proof.py::test_fifty_thousand_employees_are_each_cleared_by_a_success_on_their_state",
    # 200,000 events fanned out to four consumers per database (benchmarks/fanout.py's size);
    # the same proof at 3,000 runs on every run.
    "tests/fanout/test_proof.py::test_two_hundred_thousand_events_reach_every_consumer",
    # Hosts cut off, black-holed, killed and with clocks wrong (nox -s network): each part has
    # a test of its own on every run (tests/network/test_network_bounds.py, tests/integration/
    # test_late_claims.py, the clock tests); five databases' workers killed at random (the
    # fleet of several databases: tests/acceptance/test_many_databases.py).
    "tests/network/test_partitions.py",
    "tests/faults/test_many_databases.py",
    # The flow-control scenarios through PgBouncer: the same scenarios run directly on every
    # run (tests/acceptance), and what the pooler changes (no session outlives a transaction)
    # is checked on every run by tests/poolers' other files.
    "tests/poolers/test_pgbouncer_flow_control.py",
    # The command on asynchronous URLs: how a URL's sync twin is derived runs on every run
    # (tests/unit/test_async_urls.py), and async engines in tests/integration.
    "tests/acceptance/test_async_database_urls.py",
    # Values of megabytes: every kind of value round-trips on every run at a usual size.
    "tests/faults/test_bad_values.py::test_multi_megabyte_values_round_trip",
    # Commands over groups, operations, pauses, missing tables, fleet versions and progress:
    # what each runs is the operations layer's, checked on every run and every database by
    # tests/integration (and through the console by tests/web); their command lines and
    # output in the full run.
    "tests/acceptance/test_groups_cli.py",
    "tests/acceptance/test_operations.py",
    "tests/acceptance/test_pause.py",
    "tests/acceptance/test_missing_tables.py",
    "tests/acceptance/test_fleet_versions.py",
    "tests/acceptance/test_progress.py",
    # Limits and order kept by several `outbox work` processes: the windows and the keys'
    # turns across connections are the conformance and integration tiers', on every run.
    "tests/acceptance/test_rate_limit_processes.py",
    "tests/acceptance/test_ordered_processes.py",
    # The console in Chromium: its pages, the operator's actions and its scripts without
    # errors on every run; the chart's ranges, the header search, the live toggle, ages on
    # hover and a discard of ticked groups (each page's data: tests/web) in the full run.
    "tests/web/test_browser.py::test_the_handler_page_switches_its_chart",
    "tests/web/test_browser.py::test_the_live_toggle_stops_refreshes",
    "tests/web/test_browser.py::test_the_header_search_finds_each_kind_of_key",
    "tests/web/test_browser.py::test_an_age_reads_in_minutes_and_seconds",
    "tests/web/test_browser.py::test_an_operator_ticks_two_dead_groups",
)
# End-to-end tiers (processes, signals, outages) whose cases on other databases than PostgreSQL
# are the full run's, by tier and database (or another parameter): how each database behaves
# is what the conformance, integration, users, model and migration tiers check, on every run
# and every database.
_FULL_RUN_DATABASES = {
    "tests/acceptance/": ("mariadb", "sqlite"),
    "tests/faults/": ("mariadb", "sqlite"),
    # The examples on SQLite, as their READMEs run them first, on every run.
    "tests/examples/": ("mariadb", "postgresql"),
    # The console's answers on PostgreSQL on every run, on the others in the full run: the
    # operations layer they read is the integration tier's, on every database.
    "tests/web/": ("mariadb", "sqlite"),
    # The proofs through killed processes (the inbox's, the fan-out's, the flags'): PostgreSQL
    # on every run, the other databases in the full run.
    "tests/inbox/test_proof.py": ("mariadb", "sqlite"),
    "tests/fanout/": ("mariadb", "sqlite"),
    "tests/flags/": ("mariadb", "sqlite"),
    # The command's own behaviour on SQLite; its revisions run there on every run
    # (tests/migration/test_migrations.py).
    "tests/migration/test_migrate_command.py": ("sqlite",),
    # A link cut under a MariaDB client: the same bounds as PostgreSQL's, set by the driver's
    # own options (tests/integration/test_network_timeout.py, on every run).
    "tests/network/test_network_bounds.py": ("mariadb",),
    # Every column type as an ordering key on every run; as a group or a rate limit's key (the
    # same column types, read by the same code) in the full run.
    "tests/users/test_key_columns.py": ("group_by", "rate_limit_key"),
    # Each sink's own tests (what its downstream does) run its async class by default; the
    # contract runs both classes of every sink on every database on every run.
    "tests/sinks/test_http.py": ("sync",),
    "tests/sinks/test_nats.py": ("sync",),
    "tests/sinks/test_rabbitmq.py": ("sync",),
    "tests/sinks/test_redis.py": ("sync",),
}

POSTGRES_URL_ENV = "OUTBOX_TEST_POSTGRES_URL"
DEFAULT_POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
MARIADB_URL_ENV = "OUTBOX_TEST_MARIADB_URL"
# PyMySQL tries TLS unless told not to, building a TLS context for every connection (56 ms of
# CPU each: benchmarks/mariadb_connect.py), much of a MariaDB test's time; the local server
# has no TLS.
DEFAULT_MARIADB_URL = "mysql+pymysql://root@127.0.0.1:3306/test?ssl_disabled=true"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The default run (the README's command, and CI) keeps within its time: the soak tiers
    (the upgrade tier, the sinks' kill test) and the end-to-end tiers' cases on other databases
    than PostgreSQL run with ``OUTBOX_FULL_RUN=1`` (``nox -s full``), or when their files are
    named on the command line."""
    if os.environ.get(FULL_RUN_ENV) == "1":
        return
    root = config.rootpath
    asked = {os.path.relpath(os.path.abspath(str(arg).split("::")[0]), root) for arg in config.args}
    asked -= {"tests", "."}
    kept, left = [], []
    for item in items:
        path = item.nodeid.split("::")[0]
        if any(path.startswith(a) for a in asked):
            kept.append(item)  # named on the command line: run as asked
        elif _full_run_only(item, path):
            left.append(item)
        else:
            kept.append(item)
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = kept


def _full_run_only(item: pytest.Item, path: str) -> bool:
    if item.nodeid.startswith(_FULL_RUN_PATHS):  # a file, or one test of a file
        return True
    values = getattr(getattr(item, "callspec", None), "params", {}).values()
    named = {value for value in values if isinstance(value, str)}
    return any(
        path.startswith(tier) and not named.isdisjoint(databases)
        for tier, databases in _FULL_RUN_DATABASES.items()
    )


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


ARCHIVE_BY_DAY_ENV = "OUTBOX_TEST_ARCHIVE_BY_DAY"
"""Set (to 1): the archive of every reset PostgreSQL and MariaDB database is partitioned by day,
as migration 0010 leaves it, today's rows in today's partition (``nox -s archive_by_day``)."""


def reset_schema(url: str) -> None:
    """Empty framework tables and test models: dropped and created, or, when still as they
    were made, emptied (tests/_reset.py)."""
    _reset.reset(url, (schema.metadata, Base.metadata), _make_tables)


def _make_tables(conn: Connection) -> None:
    Base.metadata.drop_all(conn)
    schema.metadata.drop_all(conn)
    schema.metadata.create_all(conn)
    Base.metadata.create_all(conn)
    if os.environ.get(ARCHIVE_BY_DAY_ENV):
        partition_archive(conn)


def partition_archive(conn: Connection) -> None:
    """Partition the archive of a PostgreSQL or MariaDB database by day, as migration 0010
    does, with today's rows in today's partition (the migration's first day is later)."""
    today = datetime.datetime.now(datetime.UTC).date()
    if conn.dialect.name == "postgresql":
        start = datetime.datetime.combine(today, datetime.time(), datetime.UTC)
        postgresql_partitions.partition_archive(conn, 3, cut=start)
    elif conn.dialect.name in ("mysql", "mariadb"):
        mysql_partitions.partition_archive(conn, today, 3)


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
