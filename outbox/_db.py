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
from outbox import _log, schema
from outbox.exceptions import DatabaseUnavailableError, SchemaMissingError

T = TypeVar("T")

log = _log.get_logger(__name__)

TRANSACTION_ATTEMPTS = 5
TRANSACTION_BACKOFF_SECONDS = 0.05
MAX_BACKOFF_SECONDS = 2.0


def create_outbox_engine(
    url: str | URL, *, idle_transaction_timeout: float | None = None
) -> Engine:
    """An engine set up for outbox: READ COMMITTED, SQLite write locking.

    No pre-ping on checkout (a round trip per transaction): a connection found dead is
    invalidated by SQLAlchemy, and :func:`run_in_transaction` runs the transaction again.

    ``idle_transaction_timeout`` (PostgreSQL): the server ends a transaction left idle this
    long, so that a frozen worker (SIGSTOP, a stalled VM) cannot hold row locks forever.
    """
    parsed = make_url(url)
    options: dict[str, object] = {}
    if parsed.get_backend_name() == "mysql" or parsed.get_backend_name() == "mariadb":
        options["isolation_level"] = "READ COMMITTED"
    if parsed.get_backend_name() == "postgresql" and idle_transaction_timeout is not None:
        # Added to the URL's own ?options= (a search_path, say), which connect_args replaces.
        own = parsed.query.get("options", "")
        own = own[0] if isinstance(own, tuple) else own
        milliseconds = int(idle_transaction_timeout * 1000)
        options["connect_args"] = {
            "options": f"{own} -c idle_in_transaction_session_timeout={milliseconds}".strip()
        }
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
    patience: float = 0.0,
) -> T:
    """Run ``work`` in one short transaction; run it again on deadlocks and dropped connections.

    Transient errors are retried ``attempts`` times, and beyond that for as long as ``patience``
    seconds allow (a database restart takes seconds), with a capped, jittered backoff.
    ``work`` must be safe to repeat: every framework transaction is, because its writes are
    fenced by a lease token or guarded by a unique index.
    """
    deadline = time.monotonic() + patience
    attempt = 0
    while True:
        attempt += 1
        try:
            with engine.begin() as conn:
                return work(conn)
        except DBAPIError as error:
            if not dialects.is_transient(error):
                raise
            if attempt >= attempts and time.monotonic() >= deadline:
                raise
            if attempt == attempts:
                # Past the quick retries: the database is restarting or unreachable. Say it
                # once, then keep trying quietly until the patience runs out.
                log.warning(
                    _log.DATABASE_RETRYING,
                    error=dialects.error_summary(error),
                    patience=patience,
                )
            backoff = min(TRANSACTION_BACKOFF_SECONDS * 2**attempt, MAX_BACKOFF_SECONDS)
            time.sleep(backoff * (0.5 + random.random()))


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
