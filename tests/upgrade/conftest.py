"""Fixtures of the upgrade tier: the previous release installed, and empty databases.

The previous release is installed once (cached across runs, see ``_releases.py``). Without the
repository's history, or when its install fails, the tier is skipped on a developer's machine
and fails loudly when ``CI=true``, like every database test.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from tests.conftest import (
    DEFAULT_MARIADB_URL,
    DEFAULT_POSTGRES_URL,
    MARIADB_URL_ENV,
    POSTGRES_URL_ENV,
)
from tests.upgrade._harness import Size, Upgrade, size_from_environment
from tests.upgrade._releases import PREVIOUS, Release, ReleaseUnavailableError, install

# A session time zone west of UTC: the older release's local times look hours old to UTC.
ZONE = "-05:00"


def _unavailable(message: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{message} (CI=true: the upgrade tier must not skip)", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def previous_release() -> Release:
    """The release users upgrade from, installed in a virtual environment of its own."""
    try:
        return install(PREVIOUS)
    except (ReleaseUnavailableError, RuntimeError) as error:
        _unavailable(f"release {PREVIOUS} cannot be installed: {error}")
    raise AssertionError("unreachable")


@pytest.fixture(scope="session")
def upgrade_size() -> Size:
    """The size of the runs: ``OUTBOX_UPGRADE_SIZE`` (small by default, full under nox)."""
    return size_from_environment()


# Per server: the variable naming its URL, the default URL, how a database's name is quoted,
# what CREATE DATABASE and DROP DATABASE add.
_ADMIN = {
    "postgresql": (POSTGRES_URL_ENV, DEFAULT_POSTGRES_URL, '"{}"', "", " WITH (FORCE)"),
    "mariadb": (MARIADB_URL_ENV, DEFAULT_MARIADB_URL, "{}", " CHARACTER SET utf8mb4", ""),
}


@contextmanager
def _empty_database(kind: str) -> Iterator[str]:
    """A database with no tables at all on the server of ``kind``, dropped at the end."""
    env, default, quoted, charset, force = _ADMIN[kind]
    admin_url = make_url(os.environ.get(env, default))
    name = quoted.format(f"outbox_upgrade_{uuid.uuid4().hex[:10]}")
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f"CREATE DATABASE {name}{charset}"))
    except Exception as error:
        admin.dispose()
        _unavailable(f"{kind} at {admin_url.host}:{admin_url.port}: {error}")
    try:
        yield admin_url.set(database=name.strip('"')).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {name}{force}"))
        admin.dispose()


@pytest.fixture(params=["postgresql", "mariadb"])
def empty_database(request: pytest.FixtureRequest) -> Iterator[str]:
    """A database with no tables at all on each server, dropped after the test."""
    with _empty_database(request.param) as url:
        yield url


@pytest.fixture
def empty_mariadb_database() -> Iterator[str]:
    """A database with no tables at all on the MariaDB server, dropped after the test."""
    with _empty_database("mariadb") as url:
        yield url


@pytest.fixture
def upgrade(
    empty_database: str, previous_release: Release, upgrade_size: Size, tmp_path: Path
) -> Iterator[Upgrade]:
    """An empty database to upgrade from the previous release, in UTC; stopped after."""
    run = Upgrade(empty_database, previous_release, tmp_path, upgrade_size)
    try:
        yield run
    finally:
        run.close()


@pytest.fixture
def zoned_upgrade(
    empty_mariadb_database: str, previous_release: Release, upgrade_size: Size, tmp_path: Path
) -> Iterator[Upgrade]:
    """An empty MariaDB database to upgrade from the previous release, every connection of
    every process (old and new) in the session time zone ``ZONE``; stopped after."""
    run = Upgrade(empty_mariadb_database, previous_release, tmp_path, upgrade_size, zone=ZONE)
    try:
        yield run
    finally:
        run.close()
