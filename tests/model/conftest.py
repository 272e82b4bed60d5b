"""Fixtures of the model tier: each database the tier runs on, and the run's seed."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from tests.model._settings import SEED
from tests.poolers._pgbouncer import PgBouncer


@dataclass(frozen=True)
class Target:
    """A database to run cases on: the URL workers use, and the one that resets its tables."""

    name: str
    url: str
    admin_url: str


def pytest_report_header() -> str:
    return f"model tier: seed {SEED} (OUTBOX_MODEL_SEED={SEED} reproduces this run's cases)"


@pytest.fixture(params=["sqlite", "postgresql", "mariadb", "pgbouncer"])
def target(request: pytest.FixtureRequest, tmp_path: object) -> Target:
    """Each database the tier runs on: SQLite, PostgreSQL, MariaDB, and PostgreSQL through
    PgBouncer in transaction mode (its tables reset on the database itself)."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/model.sqlite3"
        return Target("sqlite", url, url)
    if request.param == "mariadb":
        url = request.getfixturevalue("mariadb_url")
        return Target("mariadb", url, url)
    postgres: str = request.getfixturevalue("postgres_url")
    if request.param == "postgresql":
        return Target("postgresql", postgres, postgres)
    bouncer: PgBouncer = request.getfixturevalue("pgbouncer")
    return Target("pgbouncer", bouncer.url, postgres)
