"""Engines, short transactions with retry of transient errors, and the checks that the tables
are there."""

from __future__ import annotations

import json
import random
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, Table, create_engine, inspect
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DatabaseError, DBAPIError, NoSuchModuleError

from outbox import schema
from outbox._core import log as _log
from outbox._db import dialects
from outbox._db.dialects.urls import on_server
from outbox.exceptions import (
    BufferTableMissingError,
    ConfigurationError,
    DatabaseUnavailableError,
    SchemaMissingError,
)

T = TypeVar("T")


log = _log.get_logger(__name__)


TRANSACTION_ATTEMPTS = 5
TRANSACTION_BACKOFF_SECONDS = 0.05
MAX_BACKOFF_SECONDS = 2.0
# From the user name's colon to the last "@": greedy, so that a password holding ":" or "@"
# is hidden whole (at worst, more than the password is).
_PASSWORD = re.compile(r"^((?:[\w+]+://)?[^:/@?]*:).*@")
URL_FORM = "postgresql+psycopg://user:password@host:port/database or sqlite:///path"


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


def sync_url(url: URL) -> URL:
    """The URL outbox connects to: ``url`` itself, or for an async driver, the same database
    on that driver's sync sibling.

    ``postgresql+asyncpg`` and ``postgresql+psycopg_async`` become ``postgresql+psycopg``,
    ``sqlite+aiosqlite`` becomes ``sqlite`` (pysqlite), ``mysql+aiomysql`` and
    ``mysql+asyncmy`` become ``mysql+pymysql``. Host, credentials, database and the query are
    kept, but for asyncpg's parameters that libpq does not take: its statement caches and
    ``command_timeout`` are dropped, ``ssl`` and ``timeout`` become ``sslmode`` and
    ``connect_timeout``, and ``direct_tls`` or ``server_settings`` are refused. An async driver
    outbox does not know, and a private SQLite ``:memory:`` database, are a
    ConfigurationError saying what to write instead.
    """
    try:
        asynchronous = url.get_dialect().is_async
    except NoSuchModuleError:
        return url  # load_driver names the unknown dialect
    if not asynchronous:
        return url
    # The sync driver outbox runs on in place of an async one, as the database's package says:
    # outbox does its own work in threads with no event loop, where an async driver cannot run.
    database = dialects.database_named(url.get_backend_name())
    synchronous = None if database is None else database.sync_url(url)
    if synchronous is None:
        raise ConfigurationError(
            f"outbox runs on a sync driver and knows none for the async {url.drivername!r}: "
            "give outbox a sync URL (postgresql+psycopg://, sqlite:///, mysql+pymysql://) "
            "or Outbox(engine=create_engine(...))"
        )
    return synchronous


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


JsonFunctions = dict[str, Callable[..., Any]]


_decoder = json.JSONDecoder()
_decode_json = _decoder.decode
# The decoder's own C scanner, which typeshed does not declare.
_scan_json: Callable[[str, int], tuple[Any, int]] = _decoder.scan_once  # type: ignore[attr-defined]


def _load_json(text: str | bytes) -> Any:
    """``json.loads`` for the JSON text a database driver hands over: the same values.

    Drivers give text (str), or UTF-8 bytes (psycopg, which calls ``json.loads`` on them):
    decoded as UTF-8 here, the bytes skip ``json.loads``' guess of their encoding, a third of
    the time of reading a small document, on the path every claimed row of a JSON buffer takes.
    Anything else goes to ``json.loads`` as it is (a number SQLite stored in a JSON column as
    REAL: its TypeError, as without outbox).

    A document that is the whole text (as PostgreSQL writes jsonb, and as most JSON is stored)
    is read by the decoder's C scanner alone: ``JSONDecoder.decode``'s two Python calls and two
    whitespace matches around it took as long again as the scan of a small document. Text with
    whitespace around its document, or that is not one, goes to ``decode``, which reads it or
    raises its own error.
    """
    if isinstance(text, bytes):
        text = text.decode()
    elif not isinstance(text, str):
        return json.loads(text)
    try:
        value, end = _scan_json(text, 0)
    except StopIteration:
        return _decode_json(text)
    return value if end == len(text) else _decode_json(text)


def json_functions(engine: Any) -> JsonFunctions:
    """The JSON functions an engine (sync or async) was created with, to give an engine made
    for the same application: they decide the values its JSON columns hold."""
    found = {
        "json_serializer": getattr(engine.dialect, "_json_serializer", None),
        "json_deserializer": getattr(engine.dialect, "_json_deserializer", None),
    }
    return {name: function for name, function in found.items() if function is not None}


def create_outbox_engine(
    url: str | URL,
    *,
    idle_transaction_timeout: float | None = None,
    network_timeout: float | None = None,
    json_options: JsonFunctions | None = None,
) -> Engine:
    """An engine set up for outbox: READ COMMITTED, SQLite write locking.

    ``json_options``: the application's ``json_serializer`` and ``json_deserializer``, if it has its
    own (see :func:`json_functions`); without a deserializer, JSON is read as ``json.loads``
    reads it, faster (:func:`_load_json`).

    No pre-ping on checkout (a round trip per transaction): a connection found dead is
    invalidated by SQLAlchemy, and :func:`run_in_transaction` runs the transaction again.

    ``idle_transaction_timeout`` (PostgreSQL, MariaDB): the server ends a transaction left idle
    this long, so that a frozen worker (SIGSTOP, a stalled VM) cannot hold row locks forever.
    Set at connect (on PostgreSQL added to any ``?options=`` of the URL; behind a connection
    pooler such as PgBouncer, per transaction instead: see ``dialects.configure_engine``).

    ``network_timeout`` (PostgreSQL, MariaDB): no wait on the network outlasts about this long
    once the other end stops answering (``Settings.network_timeout``).
    """
    parsed = parse_url(url)
    load_driver(parsed)
    options: dict[str, object] = {"json_deserializer": _load_json, **(json_options or {})}
    database = dialects.database_named(parsed.get_backend_name())
    options.update(database.ENGINE_OPTIONS if database is not None else {})
    engine = create_engine(parsed, **options)
    dialects.configure_engine(
        engine,
        idle_transaction_timeout=idle_transaction_timeout,
        network_timeout=network_timeout,
    )
    return engine


def describe(url: URL) -> str:
    """Where a URL points, without its password: ``database 'app' on db.internal:5432``, or
    as its database's package says (``SQLite database 'outbox.sqlite3'``)."""
    database = dialects.database_named(url.get_backend_name())
    return on_server(url) if database is None else database.describe(url)


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


def missing_buffer_tables(
    engine: Engine, tables: Mapping[str, Table | Sequence[Table]]
) -> dict[str, str]:
    """Of ``tables`` (handler name -> buffer table, or its tables: a fan-out's source and
    consumers), those that do not exist in the database: handler name -> the first missing
    table's name, ``schema.table`` when it has a schema.

    One look at the database's list of tables per schema the tables are in: one round trip
    for any number of tables in the connection's own schema (on PostgreSQL, any schema on its
    ``search_path``), however many handlers there are.
    """
    by_handler = {
        name: (found,) if isinstance(found, Table) else tuple(found)
        for name, found in tables.items()
    }
    names_by_schema: dict[str | None, set[str]] = {}
    with engine.connect() as conn:
        inspector = inspect(conn)
        for schema_name in {table.schema for each in by_handler.values() for table in each}:
            try:
                names_by_schema[schema_name] = set(inspector.get_table_names(schema=schema_name))
            except DBAPIError as error:
                # SQLite and MariaDB refuse to list a schema that does not exist (PostgreSQL
                # lists none): it holds no table.
                if schema_name is None or dialects.is_transient(error):
                    raise
                names_by_schema[schema_name] = set()
    missing = {
        name: [table.fullname for table in each if table.name not in names_by_schema[table.schema]]
        for name, each in by_handler.items()
    }
    return {name: found[0] for name, found in missing.items() if found}


def check_buffer_tables(engine: Engine, tables: Mapping[str, Table | Sequence[Table]]) -> None:
    """Raise BufferTableMissingError when any of ``tables`` (handler name -> buffer table)
    does not exist."""
    missing = missing_buffer_tables(engine, tables)
    if missing:
        raise BufferTableMissingError(missing)


def buffer_table_missing(
    engine: Engine, error: DBAPIError, tables: Mapping[str, Table | Sequence[Table]]
) -> BufferTableMissingError | None:
    """The error to raise in place of ``error`` when it says a table does not exist and one
    of ``tables`` (handler name -> buffer table) indeed does not; None otherwise (another
    error, or another table: one of outbox's own)."""
    if not dialects.is_missing_table(error):
        return None
    missing = missing_buffer_tables(engine, tables)
    return BufferTableMissingError(missing) if missing else None
