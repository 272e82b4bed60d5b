"""Rebuilding the bloated indexes of buffer tables on PostgreSQL (``outbox reindex``).

A buffer's rows live for minutes, so its indexes grow with every backlog and VACUUM cannot give
the space back: it makes emptied B-tree pages reusable, but an index file never shrinks. After a
backlog of a million events has drained, the buffer's indexes still take tens of megabytes for
an empty table. ``REINDEX INDEX CONCURRENTLY`` rebuilds an index beside the old one without
blocking the application's writes or the workers, then swaps them.

An index is rebuilt only when it is several times larger than the rows its table holds could
need (:data:`BLOAT_FACTOR`, with a generous size per row, so a large live backlog is left
alone) and larger than :data:`MIN_BLOATED_BYTES`. A rebuild that was interrupted leaves an
invalid index behind (``<name>_ccnew``), which PostgreSQL keeps updating on every write: those
are dropped first.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sqlalchemy import Connection, Table

from outbox._db import queries
from outbox.app import Outbox
from outbox.exceptions import ConfigurationError
from outbox.ops.progress import Phase, Progress

BLOAT_FACTOR = 4
"""An index is bloated above this many times the size its table's rows need."""
MIN_BLOATED_BYTES = 1024 * 1024
"""Smaller indexes are never rebuilt: the space is not worth a rebuild."""
BYTES_PER_ROW = 64
"""What one row costs an index at most, estimated generously: an entry of a big integer or a
UUID takes 20 to 28 bytes with its line pointer, in pages kept 90% full."""
EMPTY_INDEX_BYTES = 2 * 8192
"""A B-tree's metapage and root page."""

KEPT, REBUILT, DROPPED = "kept", "rebuilt", "dropped"
WOULD_REBUILD, WOULD_DROP = "would rebuild", "would drop"


@dataclass(frozen=True, slots=True)
class IndexReport:
    """What ``outbox reindex`` found and did for one index of a buffer table."""

    table: str
    index: str
    bytes: int
    """Size before."""
    needed_bytes: int
    """The most its table's rows could need (estimated from the table's row count)."""
    action: str
    """``kept``, ``rebuilt``, ``dropped`` (an invalid leftover of an interrupted rebuild), or,
    in a dry run, ``would rebuild`` and ``would drop``."""
    bytes_after: int | None = None
    """Size after a rebuild."""


def reindex(
    app: Outbox,
    handlers: tuple[str, ...] | list[str] = (),
    *,
    dry_run: bool = False,
    progress: Progress | None = None,
) -> list[IndexReport]:
    """Rebuild the bloated indexes of the handlers' buffer tables (all handlers when empty).

    Each table is analysed first, so that its row count is current. Statements run outside
    any transaction, as ``REINDEX ... CONCURRENTLY`` requires; a rebuild takes as long as
    building the index, and waits for transactions already running on the table.

    ``progress`` (:class:`~outbox.ops.progress.Progress`) is told the tables and each one done (a
    rebuild is one statement, which reports nothing while it runs); when it asks to stop,
    :class:`~outbox.ops.progress.StoppedError` is raised between two tables.
    """
    if not app.supports.concurrent_reindex:
        raise ConfigurationError(f"outbox reindex runs on PostgreSQL, not on {app.dialect}")
    tables = {h.table.key: h.table for h in app.select_handlers(handlers)}
    reports: list[IndexReport] = []
    with app.engine.connect() as conn:
        conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        phase = Phase(None if dry_run else progress, "reindexed", "buffer tables", len(tables))
        for table in tables.values():
            phase.check()
            reports.extend(_reindex_table(conn, table, dry_run))
            phase.advance(1)
        phase.end()
    return reports


def _reindex_table(conn: Connection, table: Table, dry_run: bool) -> list[IndexReport]:
    queries.analyze(conn, table)
    needed = int(queries.estimated_rows(conn, table) * BYTES_PER_ROW) + EMPTY_INDEX_BYTES
    reports = []
    for index in queries.table_indexes(conn, table):
        report = IndexReport(table.name, index.name, index.bytes, needed, KEPT)
        if index.leftover:
            if not dry_run:
                queries.drop_index_concurrently(conn, table, index.name)
            reports.append(replace(report, action=WOULD_DROP if dry_run else DROPPED))
        elif index.bytes > max(MIN_BLOATED_BYTES, BLOAT_FACTOR * needed):
            if dry_run:
                reports.append(replace(report, action=WOULD_REBUILD))
                continue
            queries.reindex_concurrently(conn, table, index.name)
            after = queries.index_bytes(conn, table, index.name)
            reports.append(replace(report, action=REBUILT, bytes_after=after))
        else:
            reports.append(report)
    return reports
