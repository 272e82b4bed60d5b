"""PostgreSQL's own statements (``Statements``): row locks skipped, not waited for; upserts;
claims that address rows by ``ctid``."""

from __future__ import annotations

import uuid
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import (
    CTE,
    Connection,
    Engine,
    Result,
    Row,
    Select,
    Table,
    Update,
    any_,
    delete,
    func,
    literal_column,
    select,
    text,
    tuple_,
    update,
)
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.sql import ColumnElement


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


def delete_some(conn: Connection, table: Table, where: ColumnElement[bool], limit: int) -> int:
    """Delete up to ``limit`` rows of ``table`` that are ``where``, in one statement (its
    primary key ``IN`` a limited subquery, which the planner takes as one range, where a list
    of a thousand keys costs a plan of a thousand branches); how many."""
    key = tuple_(*table.primary_key.columns)
    some = select(*table.primary_key.columns).where(where).limit(limit)
    return conn.execute(delete(table).where(key.in_(some))).rowcount


def insert_ignoring_duplicates(
    conn: Connection, table: Table, rows: Sequence[Mapping[str, Any]]
) -> int:
    """Insert ``rows``, skipping those a unique index already holds; returns how many were
    inserted. One statement for all rows; RETURNING counts exactly the rows inserted."""
    statement = postgresql_insert(table).on_conflict_do_nothing()
    returning = statement.values(list(rows)).returning(*table.primary_key.columns)
    return len(conn.execute(returning).all())


def insert_selected_ignoring_duplicates(
    conn: Connection, table: Table, columns: Sequence[str], rows: Select[Any]
) -> int:
    """Insert what ``rows`` selects into ``columns``, skipping rows a unique index already
    holds (``INSERT ... SELECT ... ON CONFLICT DO NOTHING``); how many were inserted."""
    statement = postgresql_insert(table).from_select(list(columns), rows).on_conflict_do_nothing()
    return int(conn.execute(statement).rowcount)


def insert_new(
    conn: Connection, table: Table, rows: Sequence[Mapping[str, Any]], returning: ColumnElement[Any]
) -> list[Any]:
    """Insert ``rows`` in one statement, skipping those whose key is held already (or is being
    written by a transaction still open, whose end the statement waits for); ``returning`` of
    the rows inserted."""
    statement = postgresql_insert(table).values(list(rows)).on_conflict_do_nothing()
    return list(conn.execute(statement.returning(returning)).scalars())


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
    return claimed_by(table, claimable_rows(table, limit, by_address, only_if=only_if))


def claimable_rows(table: Table, limit: int, by_address: bool, *, only_if: Any = None) -> CTE:
    """The CTE ``claimable`` of :func:`claimable`: the locked rows' ``id`` (and ``ctid`` when
    ``by_address``), for a statement that reads them besides claiming them."""
    # Unqualified ``ctid``: the pick and the UPDATE each have the buffer as their only table.
    keys = [literal_column("ctid"), table.c.id] if by_address else [table.c.id]
    pick = select(*keys).where(table.c.group_id.is_(None))
    if only_if is not None:
        pick = pick.where(only_if)
    # The limit as a literal, not a parameter: with it, the plan of a prepared claim does not
    # depend on its parameters, and PostgreSQL plans it once per connection instead of for
    # every claim (a custom plan each time cost about 0.25 ms a claim, a tenth of its work).
    pick = pick.order_by(table.c.id).limit(literal_column(str(int(limit))))
    return pick.with_for_update(skip_locked=True).cte("claimable")


def claimed_by(table: Table, locked: CTE) -> ColumnElement[bool]:
    """The UPDATE's condition on the rows ``locked`` (a :func:`claimable_rows` CTE) holds."""
    if "ctid" in locked.c:
        return literal_column("ctid") == any_(func.array(select(locked.c.ctid).scalar_subquery()))
    return table.c.id.in_(select(locked.c.id))
