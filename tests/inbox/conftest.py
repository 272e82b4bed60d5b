"""Fixtures of the inbox consumers' tests: a database with the effects table, an application
with an inbox on it."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from sqlalchemy import create_engine

from outbox import Outbox, Settings
from tests.conftest import reset_schema
from tests.inbox._support import INBOX, create_effects


def _prepared(url: str) -> str:
    reset_schema(url)
    engine = create_engine(url)
    try:
        create_effects(engine)
    finally:
        engine.dispose()
    return url


@pytest.fixture
def any_database(database_url: str) -> str:
    """Each database (SQLite, PostgreSQL, MariaDB), migrated, with the effects table."""
    return _prepared(database_url)


@pytest.fixture
def sqlite_database(sqlite_url: str) -> str:
    """A fresh SQLite database, migrated, with the effects table."""
    return _prepared(sqlite_url)


@pytest.fixture
def postgres_effects(postgres_url: str) -> str:
    """The session's PostgreSQL database, reset, with the effects table."""
    return _prepared(postgres_url)


@pytest.fixture
def app_on(make_app: Callable[..., Outbox]) -> Callable[[str], Outbox]:
    """Factory: an application on a URL that polls often, with the inbox declared."""

    def make(url: str) -> Outbox:
        app = make_app(url, Settings(poll_interval=0.05))
        app.inbox(INBOX)
        return app

    return make
