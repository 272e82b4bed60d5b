"""Async URLs and engines: outbox derives a sync URL from them, or refuses them in one line."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy.dialects import registry
from sqlalchemy.dialects.postgresql.asyncpg import PGDialect_asyncpg
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine
from structlog.testing import capture_logs

from outbox import ConfigurationError, Outbox
from outbox._core import log as _log
from outbox._db import sync_url


class UnknownAsyncDialect(PGDialect_asyncpg):
    """An async PostgreSQL driver outbox has never heard of."""

    driver = "unknownasync"


registry.register("postgresql.unknownasync", __name__, "UnknownAsyncDialect")


def derived(url: str) -> str:
    """The URL outbox derives from ``url``, password shown."""
    return sync_url(make_url(url)).render_as_string(hide_password=False)


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("postgresql+asyncpg://app:s3cret@db:5433/shop", "postgresql+psycopg://app:s3cret@db:5433/shop"),
        ("postgresql+psycopg_async://app:s3cret@db/shop", "postgresql+psycopg://app:s3cret@db/shop"),
        ("sqlite+aiosqlite:////var/lib/shop.sqlite3", "sqlite+pysqlite:////var/lib/shop.sqlite3"),
        ("mysql+aiomysql://app:s3cret@db/shop", "mysql+pymysql://app:s3cret@db/shop"),
        ("mysql+asyncmy://app:s3cret@db/shop", "mysql+pymysql://app:s3cret@db/shop"),
        ("mariadb+aiomysql://app:s3cret@db/shop", "mariadb+pymysql://app:s3cret@db/shop"),
    ],
)  # fmt: skip
def test_an_async_driver_is_swapped_for_its_sync_sibling(given: str, expected: str) -> None:
    """The same database, credentials included, on the sync driver of the same database."""
    assert expected == derived(given)


@pytest.mark.parametrize(
    "given", ["postgresql+psycopg://app@db/shop", "postgresql://app@db/shop", "sqlite:///shop.db"]
)
def test_a_sync_url_is_kept_as_it_is(given: str) -> None:
    """A URL whose driver is sync is the URL outbox connects to."""
    url = make_url(given)
    assert url is sync_url(url)


def test_query_parameters_of_other_drivers_are_kept() -> None:
    """Query parameters both drivers understand carry over."""
    given = "mysql+aiomysql://app@db/shop?charset=utf8mb4"
    assert "mysql+pymysql://app@db/shop?charset=utf8mb4" == derived(given)


def test_asyncpg_cache_and_statement_timeout_parameters_are_dropped() -> None:
    """asyncpg's statement caches and command_timeout mean nothing to psycopg: they are left out."""
    given = (
        "postgresql+asyncpg://app@db/shop?prepared_statement_cache_size=0"
        "&statement_cache_size=0&command_timeout=5&application_name=shop"
    )
    assert "postgresql+psycopg://app@db/shop?application_name=shop" == derived(given)


def test_asyncpg_ssl_becomes_libpq_sslmode() -> None:
    """asyncpg's ?ssl=require is libpq's ?sslmode=require: TLS is never quietly dropped."""
    given = "postgresql+asyncpg://app@db/shop?ssl=require"
    assert "postgresql+psycopg://app@db/shop?sslmode=require" == derived(given)


def test_asyncpg_timeout_becomes_libpq_connect_timeout_in_whole_seconds() -> None:
    """asyncpg's connect timeout in seconds is libpq's connect_timeout, rounded up."""
    given = "postgresql+asyncpg://app@db/shop?timeout=2.5"
    assert "postgresql+psycopg://app@db/shop?connect_timeout=3" == derived(given)


def test_asyncpg_direct_tls_is_refused_in_one_line() -> None:
    """A TLS setting libpq cannot spell is refused, naming it, rather than left out."""
    with pytest.raises(ConfigurationError) as raised:
        derived("postgresql+asyncpg://app:s3cret@db/shop?direct_tls=true")
    expected = (
        "postgresql+asyncpg's direct_tls has no equivalent for postgresql+psycopg, which outbox "
        "runs on: give outbox a sync URL or Outbox(engine=create_engine(...))"
    )
    assert expected == str(raised.value)


def test_an_unknown_async_driver_is_refused_in_one_line() -> None:
    """An async driver outbox knows no sync sibling of: one line saying what to give instead."""
    with pytest.raises(ConfigurationError) as raised:
        derived("postgresql+unknownasync://app:s3cret@db/shop")
    expected = (
        "outbox runs on a sync driver and knows none for the async 'postgresql+unknownasync': "
        "give outbox a sync URL (postgresql+psycopg://, sqlite:///, mysql+pymysql://) "
        "or Outbox(engine=create_engine(...))"
    )
    assert expected == str(raised.value)


@pytest.mark.parametrize("given", ["sqlite+aiosqlite://", "sqlite+aiosqlite:///:memory:"])
def test_an_aiosqlite_memory_database_is_refused(given: str) -> None:
    """A :memory: database lives in one connection: outbox's engine could never see it."""
    with pytest.raises(ConfigurationError) as raised:
        derived(given)
    expected = (
        "sqlite+aiosqlite :memory: is a database of one connection, which outbox's own engine "
        "cannot share: use a SQLite file"
    )
    assert expected == str(raised.value)


def test_outbox_on_an_async_url_connects_on_the_sync_url() -> None:
    """Outbox(async URL).url is the URL outbox's own engine connects to."""
    app = Outbox("postgresql+asyncpg://app:s3cret@db/shop")
    assert "postgresql+psycopg://app:s3cret@db/shop" == app.url.render_as_string(
        hide_password=False
    )


def test_outbox_on_an_async_engine_connects_on_its_url_with_the_password() -> None:
    """Outbox(engine=AsyncEngine) takes the engine's URL, password and all, on a sync driver."""
    app = Outbox(engine=create_async_engine("postgresql+asyncpg://app:s3cret@db/shop"))
    assert "postgresql+psycopg://app:s3cret@db/shop" == app.url.render_as_string(
        hide_password=False
    )


def test_outbox_on_an_async_url_refuses_an_unknown_async_driver_when_it_opens_its_engine() -> None:
    """Outbox(async URL) of an unknown driver is a ConfigurationError, not a traceback, on use."""
    app = Outbox("postgresql+unknownasync://app@db/shop")
    with pytest.raises(ConfigurationError, match="knows none for the async"):
        _ = app.engine


def test_deriving_a_sync_engine_is_logged_once(tmp_path: Path) -> None:
    """Opening the engine of an async URL says once which sync driver outbox runs on."""
    app = Outbox(engine=create_async_engine(f"sqlite+aiosqlite:///{tmp_path}/shop.sqlite3"))
    with capture_logs() as logs:
        first = app.engine
        second = app.engine
    first.dispose()
    derivations = [
        (entry["driver"], entry["async_driver"])
        for entry in logs
        if entry["event"] == _log.SYNC_ENGINE_DERIVED
    ]
    assert (True, [("sqlite+pysqlite", "sqlite+aiosqlite")]) == (first is second, derivations)


def test_an_async_engine_on_a_driver_with_a_sync_side_is_derived_too(tmp_path: Path) -> None:
    """create_async_engine("postgresql+psycopg://...") runs psycopg's async side: outbox derives
    its own engine on the sync side and says so."""
    app = Outbox(engine=create_async_engine("postgresql+psycopg://app@db/shop"))
    with capture_logs() as logs:
        engine = app.engine
    engine.dispose()
    derivations = [entry["driver"] for entry in logs if entry["event"] == _log.SYNC_ENGINE_DERIVED]
    assert (False, ["postgresql+psycopg"]) == (engine.dialect.is_async, derivations)
