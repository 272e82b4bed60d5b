"""MariaDB's and MySQL's URLs: an async driver's on PyMySQL; where one points."""

from __future__ import annotations

from sqlalchemy.engine import URL

from outbox._db.dialects.urls import on_server

# The sync driver outbox runs on in place of each async one.
_SYNC_DRIVERS = {"aiomysql": "pymysql", "asyncmy": "pymysql"}


def sync_url(url: URL) -> URL | None:
    """``url`` (of an async driver) on PyMySQL, under its own backend's name (``mysql`` or
    ``mariadb``); None for an async driver outbox does not know."""
    sync_driver = _SYNC_DRIVERS.get(url.get_driver_name())
    if sync_driver is None:
        return None
    return url.set(drivername=f"{url.get_backend_name()}+{sync_driver}", query=dict(url.query))


def describe(url: URL) -> str:
    """Where ``url`` points, without its password: ``database 'app' on db.internal:3306``."""
    return on_server(url)
