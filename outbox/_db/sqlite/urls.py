"""SQLite's URLs: aiosqlite's on pysqlite; where one points (a file)."""

from __future__ import annotations

from sqlalchemy.engine import URL

from outbox.exceptions import ConfigurationError

# The sync driver outbox runs on in place of each async one.
_SYNC_DRIVERS = {"aiosqlite": "pysqlite"}


def sync_url(url: URL) -> URL | None:
    """``url`` (of an async driver) on pysqlite; None for an async driver outbox does not know.
    A private ``:memory:`` database is refused (ConfigurationError): a database of one
    connection, which outbox's own engine cannot share."""
    sync_driver = _SYNC_DRIVERS.get(url.get_driver_name())
    if sync_driver is None:
        return None
    if url.database in (None, "", ":memory:"):
        raise ConfigurationError(
            f"{url.drivername} :memory: is a database of one connection, which outbox's own "
            "engine cannot share: use a SQLite file"
        )
    return url.set(drivername=f"{url.get_backend_name()}+{sync_driver}", query=dict(url.query))


def describe(url: URL) -> str:
    """Where ``url`` points: ``SQLite database 'outbox.sqlite3'``."""
    return f"SQLite database {url.database or ':memory:'!r}"
