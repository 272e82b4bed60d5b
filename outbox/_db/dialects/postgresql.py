"""PostgreSQL connections: the idle-transaction guard, directly or behind a pooler, and UTC."""

from __future__ import annotations

import uuid
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    Result,
    Row,
    Select,
    Table,
    Update,
    any_,
    event,
    func,
    literal_column,
    select,
    text,
    update,
)
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.engine import Dialect as SADialect
from sqlalchemy.sql import ColumnElement

from outbox._core import log as _log

log = _log.get_logger(__name__)


def behind_pooler(engine: Engine) -> bool:
    """True once a connection of the engine was found to go through a connection pooler
    (PgBouncer, ...), where a server session is not the client's: LISTEN hears nothing there.

    Known after the engine's first connection; only for the engines outbox creates.
    """
    timeout: IdleTimeout | None = getattr(engine, "_outbox_idle_timeout", None)
    return timeout is not None and timeout.pooled


# libpq's drivers, which take the ``options`` startup parameter (``-c name=value``).
_LIBPQ_DRIVERS = frozenset({"psycopg", "psycopg2"})
# What PgBouncer answers to a startup parameter it does not support (``options`` before 1.20,
# a setting inside ``options`` it does not track since).
_REFUSED_STARTUP_PARAMETER = "unsupported startup parameter"
_SESSION_CHECK = (
    "SELECT pg_backend_pid(), setting::int FROM pg_settings"
    " WHERE name = 'idle_in_transaction_session_timeout'"
)


# Whether a connection's transactions set the timeout themselves (in its record's info).
_SET_LOCAL_KEY = "outbox_idle_timeout_set_local"


class IdleTimeout:
    """``idle_in_transaction_session_timeout`` on every transaction of a PostgreSQL engine.

    Directly connected, it is a startup parameter (``options=-c ...``): set once per
    connection, nothing per transaction. A transaction-mode pooler hands each transaction to
    whichever server session is free, which a startup parameter or a session ``SET`` does not
    follow (PgBouncer refuses the parameter, or with ``ignore_startup_parameters`` drops it).
    A connection refused for it is made again without it, and each new connection is checked
    once, in one round trip: is its server session the one it was told of at connect (a pooler
    reports a process id of its own), and did the timeout take? Where it did not, each
    transaction begins with ``SET LOCAL`` (one more round trip). Behind a pooler, psycopg's
    automatic server-side prepared statements are turned off (the next transaction's session
    would not know them: "prepared statement ... does not exist" or "already exists").

    A timeout the server enforces of its own (``ALTER ROLE ... SET``) is not relied on: a
    pooler's older server sessions may predate it, and one session cannot vouch for the rest.
    """

    def __init__(self, engine: Engine, seconds: float) -> None:
        self.engine = engine
        self.milliseconds = int(seconds * 1000)
        self.startup_option = engine.dialect.driver in _LIBPQ_DRIVERS
        self.refused = False
        """A pooler refused the startup parameter: connect without it from now on."""
        self.pooled = False
        """A connection went through a pooler (see :func:`behind_pooler`)."""

    def install(self) -> None:
        """Listen to the engine's connects and begins."""
        if self.startup_option:
            event.listen(self.engine, "do_connect", self._connect)
        event.listen(self.engine, "connect", self._check)
        event.listen(self.engine, "begin", self._begin)
        self.engine._outbox_idle_timeout = self  # type: ignore[attr-defined]

    def _connect(self, dialect: SADialect, record: Any, cargs: Any, cparams: dict[str, Any]) -> Any:
        if self.refused:
            return None  # SQLAlchemy connects with the URL's own options, if any
        own = cparams.get("options", "")
        own = own[0] if isinstance(own, tuple) else own  # ?options= given twice
        ours = f"{own} -c idle_in_transaction_session_timeout={self.milliseconds}".strip()
        try:
            return dialect.connect(*cargs, **{**cparams, "options": ours})
        except dialect.loaded_dbapi.OperationalError as error:
            if _REFUSED_STARTUP_PARAMETER not in str(error):
                raise
            self.refused = True
            return None

    def _check(self, dbapi_connection: Any, record: Any) -> None:
        # In autocommit: no BEGIN and ROLLBACK around it.
        autocommit = dbapi_connection.autocommit
        dbapi_connection.autocommit = True
        try:
            cursor = dbapi_connection.cursor()
            cursor.execute(_SESSION_CHECK)
            server_pid, in_force = cursor.fetchone()
            cursor.close()
        finally:
            dbapi_connection.autocommit = autocommit
        told_pid = getattr(getattr(dbapi_connection, "info", None), "backend_pid", None)
        pooled = self.refused or (told_pid is not None and told_pid != server_pid)
        pooled = pooled or (self.startup_option and in_force != self.milliseconds)
        record.info[_SET_LOCAL_KEY] = pooled or in_force != self.milliseconds
        if not pooled:
            return
        if hasattr(dbapi_connection, "prepare_threshold"):
            dbapi_connection.prepare_threshold = None
        if not self.pooled:
            self.pooled = True
            log.info(
                _log.POOLER_DETECTED,
                idle_transaction_timeout="set per transaction",
                prepared_statements="off",
            )

    def _begin(self, connection: Any) -> None:
        if not connection.connection.info.get(_SET_LOCAL_KEY):
            return
        if getattr(connection.connection.driver_connection, "autocommit", False):
            return  # SET LOCAL outside a transaction block only draws a warning
        connection.exec_driver_sql(
            f"SET LOCAL idle_in_transaction_session_timeout = {self.milliseconds}"
        )


# Zones that are UTC under another name, with the abbreviation UTC (the GMT names print GMT).
_UTC_ALIASES = frozenset(
    {"Etc/UTC", "Etc/UCT", "Etc/Universal", "Etc/Zulu", "UCT", "Universal", "Zulu"}
)


def name_utc_plainly(dbapi_connection: Any, connection_record: Any) -> None:
    if dbapi_connection.info.parameter_status("TimeZone") in _UTC_ALIASES:
        dbapi_connection.execute("SET TimeZone TO 'UTC'")
        # Committed: SQLAlchemy rolls back a connection it takes from the pool, and a rolled
        # back SET is undone.
        dbapi_connection.commit()


# --- statements of PostgreSQL's own ----------------------------------------------------------


def update_picked(
    conn: Connection,
    table: Table,
    pick: Select[Any],
    values: Mapping[str, Any],
    returning: Sequence[ColumnElement[Any]],
    *,
    index: str | None = None,
) -> Sequence[Row[Any]]:
    """Update the rows ``pick`` (a SELECT of ids, ordered and limited) chooses, and return
    ``returning`` of them. The pick is a CTE, locked ``FOR UPDATE SKIP LOCKED``: concurrent
    transactions choose other rows without waiting, and a CTE runs once, where an ``IN
    (SELECT ... LIMIT n)`` subquery may be run again by the planner and update more than n."""
    picked = pick.with_for_update(skip_locked=True).cte("picked")
    statement = update(table).where(table.c.id == picked.c.id).values(dict(values))
    return conn.execute(statement.returning(*returning)).all()


def count_exclusively(
    conn: Connection, key: str, scope: Sequence[ColumnElement[bool]], counted: ColumnElement[bool]
) -> int:
    """The rows of ``scope`` that are ``counted``, counted so that no other transaction counting
    under the same ``key`` runs until this one ends: a transaction-scoped advisory lock,
    released at commit."""
    conn.execute(select(func.pg_advisory_xact_lock(func.hashtext(key))))
    return int(conn.execute(select(func.count()).where(*scope, counted)).scalar_one())


def insert_ignoring_duplicates(
    conn: Connection, table: Table, rows: Sequence[Mapping[str, Any]]
) -> int:
    """Insert ``rows``, skipping those a unique index already holds; returns how many were
    inserted. One statement for all rows; RETURNING counts exactly the rows inserted."""
    statement = postgresql_insert(table).on_conflict_do_nothing()
    returning = statement.values(list(rows)).returning(*table.primary_key.columns)
    return len(conn.execute(returning).all())


def plan_each_time(conn: Connection) -> None:
    """Plan the rest of the transaction's statements for their values (``SET LOCAL
    plan_cache_mode = force_custom_plan``): a lookup of hundreds of keys prepared while its
    table was empty keeps a generic plan that reads the whole table once it is not, until the
    next ANALYZE."""
    conn.execute(text("SET LOCAL plan_cache_mode = force_custom_plan"))


def ids_written(conn: Connection, table: Table, highest: int) -> None:
    """After rows written with explicit ids up to ``highest``: move the id's sequence past it
    when it is behind. A row given its id leaves the sequence where it was, and the
    application's next event would be given that id again and refused; a replay writes
    archived ids, which came from the sequence, so it moves only when the sequence was set
    back (``TRUNCATE ... RESTART IDENTITY``, a restored database)."""
    name = conn.dialect.identifier_preparer.format_table(table)
    sequence = conn.execute(select(func.pg_get_serial_sequence(name, "id"))).scalar_one()
    if sequence is None:
        return
    conn.execute(
        text(
            "SELECT setval(CAST(:sequence AS regclass), :highest) "
            "WHERE :highest > coalesce(pg_sequence_last_value(CAST(:sequence AS regclass)), 0)"
        ),
        {"sequence": sequence, "highest": highest},
    )


def add_counts(
    conn: Connection, table: Table, rows: Sequence[Mapping[str, Any]], counters: Sequence[str]
) -> None:
    """Insert ``rows``, or add their ``counters`` to the row their primary key already has:
    one ``INSERT ... ON CONFLICT DO UPDATE`` for all of them."""
    statement = postgresql_insert(table).values(list(rows))
    added = {name: table.c[name] + statement.excluded[name] for name in counters}
    keys = list(table.primary_key.columns)
    conn.execute(statement.on_conflict_do_update(index_elements=keys, set_=added))


def claim(conn: Connection, table: Table, group_id: uuid.UUID, limit: int, only: Any = None) -> int:
    """Stamp ``group_id`` on up to ``limit`` unclaimed rows of a buffer (``only``: those that
    meet this condition too), oldest first; returns how many (see :func:`claimable`)."""
    return conn.execute(_claim_update(conn, table, group_id, limit, only)).rowcount


def claim_returning(
    conn: Connection, table: Table, group_id: uuid.UUID, limit: int, only: Any = None
) -> Result[Any]:
    """:func:`claim`, returning every column of the rows it stamped from the same statement."""
    return conn.execute(_claim_update(conn, table, group_id, limit, only).returning(*table.c))


def _claim_update(
    conn: Connection, table: Table, group_id: uuid.UUID, limit: int, only: Any
) -> Update:
    """The claim as one UPDATE (:func:`claimable`), addressing rows as :func:`addressable`
    says of the table."""
    where = claimable(table, limit, by_address=addressable(conn, table), only_if=only)
    return update(table).where(where).values(group_id=group_id)


def addressable(conn: Connection, table: Table) -> bool:
    """Whether a claim may address ``table``'s rows by ``ctid``: unless the table is
    partitioned (a ``ctid`` is unique only within one partition). Asked once per engine and
    table."""
    known = _ADDRESSABLE.setdefault(conn.engine, {})
    if table.fullname not in known:
        name = conn.dialect.identifier_preparer.format_table(table)
        kind = conn.execute(
            text("SELECT relkind FROM pg_class WHERE oid = to_regclass(:name)"), {"name": name}
        ).scalar()
        known[table.fullname] = kind != "p"
    return known[table.fullname]


_ADDRESSABLE: weakref.WeakKeyDictionary[Engine, dict[str, bool]] = weakref.WeakKeyDictionary()


def claimable(
    table: Table, limit: int, by_address: bool, *, only_if: Any = None
) -> ColumnElement[bool]:
    """The claim's condition. The CTE ``claimable``, ``SELECT ... WHERE group_id IS NULL ORDER
    BY id LIMIT n FOR UPDATE SKIP LOCKED``, locks up to ``limit`` unclaimed rows, oldest first,
    skipping locked ones (``only_if``: an extra condition of the pick); the UPDATE takes them by
    address, ``ctid = ANY(ARRAY(SELECT ctid FROM claimable))``, or, where the table is not
    :func:`addressable`, by id, ``id IN (SELECT id FROM claimable)``.

    The CTE runs exactly once, so at most ``limit`` rows are claimed; an ``IN (SELECT ...
    LIMIT n FOR UPDATE SKIP LOCKED)`` may be run again by the planner and claim more. SKIP
    LOCKED lets concurrent claimers take disjoint rows without waiting, and rows of uncommitted
    application transactions are invisible, so a claim neither blocks the application nor sees
    its rows early. The partial index ``ix_<table>_unclaimed`` serves the ordered scan.

    A row locked by this transaction cannot move before the UPDATE reaches it, so its ``ctid``
    from the CTE still addresses it: the UPDATE fetches all the rows in one TID scan instead of
    a primary-key lookup per row (PostgreSQL's CPU per drain fell by a quarter,
    benchmarks/README.md). Should a row have moved anyway, the TID scan would find no current
    row at the old address and leave it unclaimed for the next claim: never claimed twice,
    never lost.
    """
    # Unqualified ``ctid``: the pick and the UPDATE each have the buffer as their only table.
    key = literal_column("ctid") if by_address else table.c.id
    pick = select(key).where(table.c.group_id.is_(None))
    if only_if is not None:
        pick = pick.where(only_if)
    locked = (
        pick.order_by(table.c.id).limit(limit).with_for_update(skip_locked=True).cte("claimable")
    )
    if by_address:
        return key == any_(func.array(select(locked.c.ctid).scalar_subquery()))
    return table.c.id.in_(select(locked.c.id))
