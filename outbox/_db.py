"""Engines, short transactions with retry of transient errors, and the schema check."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy import Connection, Engine, create_engine, inspect
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import DBAPIError, OperationalError

from outbox import _dialects as dialects
from outbox import schema
from outbox.exceptions import DatabaseUnavailableError, SchemaMissingError

T = TypeVar("T")

TRANSACTION_ATTEMPTS = 5
TRANSACTION_BACKOFF_SECONDS = 0.05


def create_outbox_engine(url: str | URL) -> Engine:
    """An engine set up for outbox: pre-pinged pool, READ COMMITTED, SQLite write locking."""
    parsed = make_url(url)
    options: dict[str, object] = {"pool_pre_ping": True}
    if parsed.get_backend_name() == "mysql" or parsed.get_backend_name() == "mariadb":
        options["isolation_level"] = "READ COMMITTED"
    engine = create_engine(parsed, **options)
    dialects.configure_engine(engine)
    return engine


def describe(url: URL) -> str:
    """Where a URL points, without its password: ``database 'app' on db.internal:5432``."""
    if url.get_backend_name() == "sqlite":
        return f"SQLite database {url.database or ':memory:'!r}"
    host = url.host or "localhost"
    port = f":{url.port}" if url.port else ""
    return f"database {url.database!r} on {host}{port}"


def run_in_transaction(
    engine: Engine,
    work: Callable[[Connection], T],
    *,
    attempts: int = TRANSACTION_ATTEMPTS,
) -> T:
    """Run ``work`` in one short transaction; run it again on deadlocks and dropped connections.

    ``work`` must be safe to repeat: every framework transaction is, because its writes are
    fenced by a lease token or guarded by a unique index.
    """
    for attempt in range(1, attempts + 1):
        try:
            with engine.begin() as conn:
                return work(conn)
        except DBAPIError as error:
            if attempt == attempts or not dialects.is_transient(error):
                raise
            time.sleep(TRANSACTION_BACKOFF_SECONDS * attempt * (0.5 + random.random()))
    raise AssertionError("unreachable")  # pragma: no cover


def check_connection(engine: Engine) -> None:
    """Connect once; raise DatabaseUnavailableError naming the host, never the password."""
    try:
        with engine.connect():
            pass
    except OperationalError as error:
        reason = str(error.orig).strip().splitlines()[0] if error.orig else type(error).__name__
        password = engine.url.password
        if password:
            reason = reason.replace(str(password), "***")
        raise DatabaseUnavailableError(
            f"cannot connect to {describe(engine.url)}: {reason}"
        ) from error


def check_schema(engine: Engine) -> None:
    """Raise SchemaMissingError when any of the framework's tables does not exist."""
    check_connection(engine)
    with engine.connect() as conn:
        existing = set(inspect(conn).get_table_names())
    missing = [name for name in schema.TABLE_NAMES if name not in existing]
    if missing:
        raise SchemaMissingError(missing)
