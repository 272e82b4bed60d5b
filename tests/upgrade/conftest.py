"""Fixtures of the upgrade tier: the previous release installed, and empty databases.

The previous release is installed once (cached across runs, see ``_releases.py``). Without the
repository's history, or when its install fails, the tier is skipped on a developer's machine
and fails loudly when ``CI=true``, like every database test.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
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


@pytest.fixture
def start_upgrade(
    previous_release: Release, upgrade_size: Size, tmp_path: Path
) -> Iterator[Callable[..., Upgrade]]:
    """Start upgrades from the previous release: ``start_upgrade(kind, zone=None)`` on an empty
    database of ``kind`` (``postgresql`` or ``mariadb``), every connection of every process in
    the session time zone ``zone`` when given; stopped and dropped after the test."""
    with ExitStack() as stack:

        def start(kind: str, zone: str | None = None) -> Upgrade:
            url = stack.enter_context(_empty_database(kind))
            workdir = Path(tempfile.mkdtemp(prefix=f"{kind}-", dir=tmp_path))
            run = Upgrade(url, previous_release, workdir, upgrade_size, zone=zone)
            stack.callback(run.close)
            return run

        yield start


@pytest.fixture(params=["postgresql", "mariadb"])
def upgrade(request: pytest.FixtureRequest, start_upgrade: Callable[..., Upgrade]) -> Upgrade:
    """An empty database on each server to upgrade from the previous release, in UTC."""
    return start_upgrade(request.param)


@pytest.fixture
def zoned_upgrade(start_upgrade: Callable[..., Upgrade]) -> Upgrade:
    """An empty MariaDB database to upgrade from the previous release, every connection of
    every process (old and new) in the session time zone ``ZONE``."""
    return start_upgrade("mariadb", ZONE)
