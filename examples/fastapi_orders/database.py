"""Where the database is, and the application's async engine and sessions.

``DATABASE_URL`` names an async driver: ``sqlite+aiosqlite:///...`` (the default, a file next to
this module, so the example runs anywhere) or ``postgresql+asyncpg://...``. The web application
and the outbox worker read the same variable: they share one database, as they must, since the
events are written in the application's own transactions.
"""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine

HERE = Path(__file__).resolve().parent
DATABASE_URL_ENV = "DATABASE_URL"
DEFAULT_DATABASE_URL = f"sqlite+aiosqlite:///{HERE / 'fastapi_orders.sqlite3'}"
# How long a SQLite writer waits for another one (the worker, a concurrent request) to commit.
SQLITE_BUSY_TIMEOUT_SECONDS = 30.0


def database_url() -> str:
    """The async database URL: ``DATABASE_URL``, else the SQLite file next to this module."""
    return os.environ.get(DATABASE_URL_ENV, DEFAULT_DATABASE_URL)


def make_engine(url: str) -> AsyncEngine:
    """The application's engine on ``url``."""
    if url.startswith("sqlite"):
        return create_async_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_SECONDS})
    return create_async_engine(url, pool_size=10, pool_pre_ping=True)


engine = make_engine(database_url())
# expire_on_commit=False, as for any AsyncSession: an attribute read after the commit must not
# need a query, which an async session cannot run implicitly.
sessions = async_sessionmaker(engine, expire_on_commit=False)
