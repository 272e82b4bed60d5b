"""Engines, short transactions with retry of transient errors, and the schema check."""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy import Connection, Engine, create_engine, inspect
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DatabaseError, DBAPIError, NoSuchModuleError

from outbox import _dialects as dialects
from outbox import _log, schema
from outbox.exceptions import ConfigurationError, DatabaseUnavailableError, SchemaMissingError

T = TypeVar("T")

log = _log.get_logger(__name__)

TRANSACTION_ATTEMPTS = 5
TRANSACTION_BACKOFF_SECONDS = 0.05
MAX_BACKOFF_SECONDS = 2.0

# From the user name's colon to the last "@": greedy, so that a password holding ":" or "@"
# is hidden whole (at worst, more than the password is).
_PASSWORD = re.compile(r"^((?:[\w+]+://)?[^:/@?]*:).*@")


URL_FORM = "postgresql+psycopg://user:password@host:port/database or sqlite:///path"
"""What a database URL looks like, for error messages."""


def redact(text: str) -> str:
    """A database URL as typed, with whatever may be its password replaced by ``***``."""
    return _PASSWORD.sub(r"\1***@", text)


def parse_url(url: str | URL) -> URL:
    """Parse a database URL; ConfigurationError saying what is wrong, never the password."""
    if isinstance(url, URL):
        return url
    try:
        return make_url(url)
    except ArgumentError as error:
        raise ConfigurationError(
            f"cannot parse {redact(url)!r}: a database URL looks like {URL_FORM}"
        ) from error
    except ValueError as error:  # the only one make_url raises: int() of the port
        raise ConfigurationError(
            f"cannot parse {redact(url)!r}: its port is not a number"
        ) from error


def load_driver(url: URL) -> None:
    """Import the URL's SQLAlchemy dialect and database driver, connecting to nothing.

    A dialect SQLAlchemy does not know, or a driver that is not installed, is a
    ConfigurationError naming it.
    """
    shown = url.render_as_string(hide_password=True)
    try:
        url.get_dialect().import_dbapi()
    except NoSuchModuleError as error:
        raise ConfigurationError(
            f"SQLAlchemy has no dialect {url.drivername!r} (in {shown})"
        ) from error
    except ImportError as error:
        raise ConfigurationError(
            f"the driver {error.name or url.drivername} is not installed (needed by {shown})"
        ) from error
    except NotImplementedError:
        pass  # a dialect with only the legacy dbapi(): create_engine() imports it


def create_outbox_engine(
    url: str | URL, *, idle_transaction_timeout: float | None = None
) -> Engine:
    """An engine set up for outbox: READ COMMITTED, SQLite write locking.

    No pre-ping on checkout (a round trip per transaction): a connection found dead is
    invalidated by SQLAlchemy, and :func:`run_in_transaction` runs the transaction again.

    ``idle_transaction_timeout`` (PostgreSQL): the server ends a transaction left idle this
    long, so that a frozen worker (SIGSTOP, a stalled VM) cannot hold row locks forever.
    """
    parsed = parse_url(url)
    load_driver(parsed)
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
    """Connect once; raise DatabaseUnavailableError naming the host, never the password.

    Besides a server that cannot be reached, this covers a database that is there but cannot
    be used: a SQLite path that names a file which is not a database ("file is not a
    database"). Either way nothing can run until the database is fixed, not the command line.
    """
    try:
        with engine.connect():
            pass
    except DatabaseError as error:
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
