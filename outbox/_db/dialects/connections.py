"""An engine's connections set up for outbox, as its database's package says."""

from __future__ import annotations

from sqlalchemy import Engine

from outbox._db.dialects.registry import database, database_named, name_of


def configure_engine(
    engine: Engine,
    *,
    idle_transaction_timeout: float | None = None,
    network_timeout: float | None = None,
) -> None:
    """Set up connections of an engine the way outbox needs them (once per engine): its
    database's ``configure`` (SQLite: the write lock up front; PostgreSQL: UTC by that name,
    the idle-transaction guard; MariaDB: the oldest server, the idle-transaction guard).

    ``idle_transaction_timeout`` (PostgreSQL, MariaDB; float seconds): the server ends a
    transaction left idle this long, so that a frozen worker cannot hold row locks forever.
    ``network_timeout`` (PostgreSQL, MariaDB; float seconds): no wait on the network outlasts
    about this long once the other end stops answering (``Settings.network_timeout``); only for
    the engines outbox creates, whose connections are its own.
    """
    if getattr(engine, "_outbox_configured", False):
        return
    database(name_of(engine.dialect)).configure(engine, idle_transaction_timeout, network_timeout)
    engine._outbox_configured = True  # type: ignore[attr-defined]


def read_committed(engine: Engine) -> Engine:
    """``engine`` for outbox's own transactions: on MariaDB and MySQL at READ COMMITTED.

    At their default, REPEATABLE READ, a claim's locking read also locks the gaps of the index
    it scans, and the application's INSERTs wait behind it. An application's engine keeps its
    own level: outbox gets a copy sharing its pool (``Engine.execution_options``) that sets the
    level on each connection it checks out. Elsewhere, ``engine`` itself.
    """
    return database(name_of(engine.dialect)).read_committed(engine)


def behind_pooler(engine: Engine) -> bool:
    """True once a connection of the engine was found to go through a connection pooler
    (PgBouncer, ...), where a server session is not the client's: LISTEN hears nothing there.

    Known after the engine's first connection; only for the engines outbox creates.
    """
    found = database_named(engine.dialect.name)
    return found is not None and found.behind_pooler(engine)
