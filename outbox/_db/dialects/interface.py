"""The one interface every database's package implements (``Database``), and what it can do
(``Supports``).

A database is a package of ``outbox._db`` (``postgresql``, ``sqlite``, ``mysql``) whose
``__init__`` offers the members of :class:`Database` as plain module attributes and functions:
what differs between databases holds no state, and mypy checks each package against the
protocol where the registry (``registry.DATABASES``) lists it. Nothing here imports a package.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from enum import StrEnum
from types import ModuleType
from typing import Any, Protocol

from sqlalchemy import Connection, Engine, Result, Row, Select, Table
from sqlalchemy.engine import URL
from sqlalchemy.engine import Dialect as SADialect
from sqlalchemy.sql import ColumnElement
from sqlalchemy.sql.selectable import NamedFromClause


@dataclass(frozen=True)
class Supports:
    """What a database can do. Code outside the SQL layer asks these questions, and never
    compares a database's name: a new database is a new set of answers."""

    one_statement_claim: bool
    """A claim job's claim is one statement: its lease extended as the fence, the rows
    stamped and returned, the batch job inserted, the probe for more rows (``UPDATE ...
    RETURNING`` inside CTEs)."""
    one_statement_completion: bool
    """A group whose events all succeeded is finished in one statement (data-modifying CTEs)."""
    listen_notify: bool
    """``LISTEN``/``NOTIFY``: triggers wake idle workers (``outbox notify``)."""
    concurrent_reindex: bool
    """``REINDEX ... CONCURRENTLY``: bloated indexes rebuilt without blocking writes."""
    zone_free_clock: str | None
    """Why no stored point in time depends on a session's time zone here (the reason, for
    ``outbox migrate-buffers`` to say); None where it can: MariaDB's and MySQL's
    ``CURRENT_TIMESTAMP`` is the session's local time, stored in a DATETIME with no zone, so a
    column default of it (as older releases of outbox wrote) dates rows in each session's zone."""


@dataclass(frozen=True)
class LockHolder:
    """A session that holds, or may hold, a lock a migration waited for."""

    pid: int
    seconds: float | None
    """How long its transaction has been open, in seconds; None when the database does not say."""
    query: str
    """The start of its current (PostgreSQL: or last) statement; empty when idle."""


class RunLockTimeoutError(Exception):
    """Another run held the lock of ``outbox migrate`` longer than the wait allowed."""

    def __init__(self, holder: int | None) -> None:
        self.holder = holder
        super().__init__(holder)


class Statements(Protocol):
    """The statements each database writes its own way (``queries/`` asks for them through
    ``statements(name)``)."""

    def update_picked(
        self,
        conn: Connection,
        table: Table,
        pick: Select[Any],
        values: Mapping[str, Any],
        returning: Sequence[ColumnElement[Any]],
        *,
        index: str | None = None,
    ) -> Sequence[Row[Any]]: ...

    def insert_ignoring_duplicates(
        self, conn: Connection, table: Table, rows: Sequence[Mapping[str, Any]]
    ) -> int: ...

    def insert_selected_ignoring_duplicates(
        self, conn: Connection, table: Table, columns: Sequence[str], rows: Select[Any]
    ) -> int: ...

    def insert_new(
        self,
        conn: Connection,
        table: Table,
        rows: Sequence[Mapping[str, Any]],
        returning: ColumnElement[Any],
    ) -> list[Any]: ...

    def delete_some(
        self, conn: Connection, table: Table, where: ColumnElement[bool], limit: int
    ) -> int: ...

    def plan_each_time(self, conn: Connection) -> None: ...

    def ids_written(self, conn: Connection, table: Table, highest: int) -> None: ...

    def add_counts(
        self,
        conn: Connection,
        table: Table,
        rows: Sequence[Mapping[str, Any]],
        counters: Sequence[str],
    ) -> None: ...

    def claim(
        self, conn: Connection, table: Table, group_id: uuid.UUID, limit: int, only: Any = None
    ) -> int: ...

    def claim_returning(
        self, conn: Connection, table: Table, group_id: uuid.UUID, limit: int, only: Any = None
    ) -> Result[Any]: ...

    def count_exclusively(
        self,
        conn: Connection,
        key: str,
        scope: Sequence[ColumnElement[bool]],
        counted: ColumnElement[bool],
    ) -> int: ...


@dataclass(frozen=True, slots=True)
class ArchivePartition:
    """A partition of the archive: its name, the UTC day it holds (None: the rows before the
    first day, or the rows of days with no partition), the rows the database estimates it
    holds (after ANALYZE), of which dead letters, and its size with its indexes."""

    name: str
    day: dt.date | None
    rows: int
    dead_rows: int
    bytes: int


class DayRetired(StrEnum):
    """What retention did with a day of the archive past its age."""

    DROPPED = "dropped"
    """No dead letter: the day's partition is gone."""
    EMPTIED = "emptied"
    """Its history is gone; its dead letters stay, and the partition with them."""
    KEPT = "kept"
    """Only dead letters left in it already: nothing done."""


class Database(Statements, Protocol):
    """Everything outbox needs of one database: its statements, and its names, capabilities,
    connections, errors, archive payloads and migration locks.

    Its clock (how ``db_now``, ``db_now_plus``... of ``dialects.clock`` render) is registered
    with SQLAlchemy when the package is imported (``@compiles`` in its ``clock`` module).
    """

    NAME: str
    """outbox's name of the database (what ``name_of`` answers, ``app.dialect``)."""
    SQLALCHEMY_NAMES: frozenset[str]
    """The names SQLAlchemy gives its dialects (``Dialect.name``, a URL's backend)."""
    SUPPORTS: Supports
    SKIP_LOCKED: bool
    """Whether its claims lock rows ``FOR UPDATE SKIP LOCKED`` (False: a lock of the whole
    database is the claim's)."""
    ENGINE_OPTIONS: Mapping[str, Any]
    """What ``create_engine`` is given for the engines outbox creates."""
    PARTITIONS: ModuleType | None
    """Its module of the archive's partitions by day (``is_partitioned``, ``partitions``,
    ``days``, ``first_day``, ``has_day``, ``make_day``, ``retire_day``, ``count_history``,
    ``bound_lock_waits``, ``unbound_lock_waits``, ``try_lock``, ``unlock``); None where the
    database has no partitions (SQLite)."""

    def sqlalchemy_dialect(self) -> SADialect:
        """A dialect object of the database, for compiling with no connection."""
        ...

    # --- URLs ---

    def sync_url(self, url: URL) -> URL | None:
        """``url``, of an async driver, on the sync driver outbox runs on in its place; None
        for an async driver it knows no sibling of (ConfigurationError for a URL it cannot
        take over)."""
        ...

    def describe(self, url: URL) -> str:
        """Where ``url`` points, without its password."""
        ...

    # --- connections ---

    def configure(
        self,
        engine: Engine,
        idle_transaction_timeout: float | None,
        network_timeout: float | None = None,
    ) -> None:
        """Set up the engine's connections the way outbox needs them (once per engine);
        ``network_timeout``: bound every wait on the network of its connections to about that
        many seconds once the other end stops answering."""
        ...

    def read_committed(self, engine: Engine) -> Engine:
        """``engine`` for outbox's own transactions (READ COMMITTED where it is not)."""
        ...

    def behind_pooler(self, engine: Engine) -> bool:
        """True once a connection was found to go through a connection pooler."""
        ...

    def reading_connection(self, engine: Engine) -> Connection:
        """A connection for one statement that only reads, as the database runs it fastest."""
        ...

    # --- errors (each answers None for an error that is not of its drivers) ---

    def is_transient(self, orig: object, error: BaseException) -> bool | None:
        """Contention or a dropped connection: running the transaction again may pass."""
        ...

    def is_missing_table(self, orig: object) -> bool | None:
        """A statement failed because a table (or its schema) does not exist."""
        ...

    def is_lock_timeout(self, orig: object) -> bool | None:
        """A statement gave up waiting for a lock (``bounded_lock_waits``)."""
        ...

    def without_values(self, message: str) -> str:
        """A driver's primary message with any value it quotes removed."""
        ...

    # --- the archive's payload ---

    def row_as_json(self, row: NamedFromClause, *, lenient: bool = False) -> ColumnElement[Any]:
        """A JSON object of one row's columns, by column name (``payload.row_as_json``)."""
        ...

    # --- ``outbox migrate`` ---

    def bounded_lock_waits(self, conn: Connection, seconds: float) -> AbstractContextManager[None]:
        """Every lock ``conn``'s transaction waits for, it waits for at most ``seconds``."""
        ...

    def lock_holders(self, conn: Connection, table: str | None) -> list[LockHolder]:
        """Who holds a lock on ``table``, longest open first, as far as the database says."""
        ...

    def run_lock(self, engine: Engine, wait: float) -> AbstractContextManager[Connection | None]:
        """Hold the lock of ``outbox migrate`` (:class:`RunLockTimeoutError` after ``wait``)."""
        ...

    def rerunnable_ddl(self, conn: Connection) -> None:
        """Issue the migrations' DDL on ``conn`` so that a revision stopped half-way can run
        again whole (nothing to do where DDL is transactional)."""
        ...
