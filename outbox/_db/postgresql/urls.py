"""PostgreSQL's URLs: an async driver's URL on psycopg, whose query libpq takes; where one
points."""

from __future__ import annotations

import math

from sqlalchemy.engine import URL

from outbox._db.dialects.urls import on_server
from outbox.exceptions import ConfigurationError

# The sync driver outbox runs on in place of each async one.
_SYNC_DRIVERS = {"asyncpg": "psycopg", "psycopg_async": "psycopg"}

# asyncpg's own query parameters, which libpq (psycopg) does not take. Dropped: its client-side
# statement caches and its per-statement timeout, which tune the application's connections and
# mean nothing to outbox's. Renamed: the same setting under libpq's name. Refused: TLS and
# server settings that have no libpq spelling, which outbox cannot quietly leave out.
_ASYNCPG_DROPPED = frozenset(
    {
        "prepared_statement_cache_size",
        "statement_cache_size",
        "max_cached_statement_lifetime",
        "max_cacheable_statement_size",
        "command_timeout",
    }
)


_ASYNCPG_RENAMED = {"ssl": "sslmode", "timeout": "connect_timeout"}
_ASYNCPG_REFUSED = frozenset({"direct_tls", "server_settings"})


def _libpq_value(name: str, value: str | tuple[str, ...]) -> str | tuple[str, ...]:
    """An asyncpg query value as libpq takes it: whole seconds for ``connect_timeout``."""
    if name != "timeout" or not isinstance(value, str):
        return value
    try:
        return str(math.ceil(float(value)))
    except ValueError:
        return value  # libpq names the bad value when it connects


def sync_url(url: URL) -> URL | None:
    """``url`` (of an async driver) on psycopg; None for an async driver outbox does not know.

    asyncpg's parameters that libpq does not take: its statement caches and
    ``command_timeout`` are dropped, ``ssl`` and ``timeout`` become ``sslmode`` and
    ``connect_timeout``, and ``direct_tls`` or ``server_settings`` are refused
    (ConfigurationError).
    """
    backend, driver = url.get_backend_name(), url.get_driver_name()
    sync_driver = _SYNC_DRIVERS.get(driver)
    if sync_driver is None:
        return None
    query = dict(url.query)
    if driver == "asyncpg":
        if refused := sorted(_ASYNCPG_REFUSED & query.keys()):
            raise ConfigurationError(
                f"{url.drivername}'s {', '.join(refused)} has no equivalent for "
                f"{backend}+{sync_driver}, which outbox runs on: give outbox a sync URL "
                "or Outbox(engine=create_engine(...))"
            )
        query = {
            _ASYNCPG_RENAMED.get(name, name): _libpq_value(name, value)
            for name, value in query.items()
            if name not in _ASYNCPG_DROPPED
        }
    return url.set(drivername=f"{backend}+{sync_driver}", query=query)


def describe(url: URL) -> str:
    """Where ``url`` points, without its password: ``database 'app' on db.internal:5432``."""
    return on_server(url)
