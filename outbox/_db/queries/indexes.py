"""Statements for ``outbox reindex`` (PostgreSQL): index sizes and rebuilds."""

from __future__ import annotations

from sqlalchemy import (
    Connection,
    Table,
    text,
)

from outbox._db.types import IndexInfo

# What an interrupted REINDEX CONCURRENTLY leaves: the new index it was building, or the old one
# it had swapped out, both invalid.
_REINDEX_LEFTOVER = r"_cc(new|old)[0-9]*$"


def _qualified(conn: Connection, table: Table, name: str | None = None) -> str:
    """The quoted name of ``table``, or of its index ``name`` (in the table's schema)."""
    preparer = conn.dialect.identifier_preparer
    if name is None:
        return preparer.format_table(table)
    prefix = f"{preparer.quote_schema(table.schema)}." if table.schema else ""
    return prefix + preparer.quote(name)


def analyze(conn: Connection, table: Table) -> None:
    """Refresh the planner's statistics of a table, its row count among them."""
    conn.exec_driver_sql(f"ANALYZE {_qualified(conn, table)}")


def estimated_rows(conn: Connection, table: Table) -> float:
    """The table's row count as its statistics have it (0 when never analysed)."""
    stmt = text("SELECT reltuples FROM pg_class WHERE oid = CAST(:name AS regclass)")
    found = conn.execute(stmt, {"name": _qualified(conn, table)}).scalar_one()
    return max(float(found), 0.0)


def table_indexes(conn: Connection, table: Table) -> list[IndexInfo]:
    """Every index of a table with its size on disk, by name."""
    stmt = text(
        "SELECT c.relname, pg_relation_size(i.indexrelid),"
        " NOT i.indisvalid AND c.relname ~ :leftover"
        " FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid"
        " WHERE i.indrelid = CAST(:name AS regclass) ORDER BY c.relname"
    )
    params = {"name": _qualified(conn, table), "leftover": _REINDEX_LEFTOVER}
    return [
        IndexInfo(name, int(size), bool(leftover))
        for name, size, leftover in conn.execute(stmt, params)
    ]


def index_bytes(conn: Connection, table: Table, name: str) -> int:
    """The size of one index on disk."""
    stmt = text("SELECT pg_relation_size(CAST(:name AS regclass))")
    return int(conn.execute(stmt, {"name": _qualified(conn, table, name)}).scalar_one())


def reindex_concurrently(conn: Connection, table: Table, name: str) -> None:
    """Rebuild an index without blocking writes (outside a transaction)."""
    conn.exec_driver_sql(f"REINDEX INDEX CONCURRENTLY {_qualified(conn, table, name)}")


def drop_index_concurrently(conn: Connection, table: Table, name: str) -> None:
    """Drop an index without blocking writes (outside a transaction)."""
    conn.exec_driver_sql(f"DROP INDEX CONCURRENTLY IF EXISTS {_qualified(conn, table, name)}")
