"""Instant wake-ups on PostgreSQL: buffer triggers NOTIFY, idle workers LISTEN.

Each buffer table gets a statement-level ``AFTER INSERT`` trigger that sends the table's name
on the ``outbox`` channel; the application's write path sends no extra statement, and the
notification arrives only after its transaction commits. A worker listens on a connection of
its own and, on a notification, distributes for that buffer's handler at once instead of
waiting for its next poll. Without notifications (another database, ``Settings(listen=False)``,
or a connection pooler in front, where LISTEN hears nothing and workers do not listen), polling
still finds all work.
"""

from __future__ import annotations

from sqlalchemy import text

from outbox._db import queries
from outbox.app import Outbox


def install(app: Outbox, handlers: tuple[str, ...] | list[str] = ()) -> list[str]:
    """Create (or replace) the notify trigger of each handler's buffer; returns the tables."""
    _require_postgresql(app)
    selected = app.select_handlers(handlers)
    with app.engine.begin() as conn:
        conn.execute(text(queries.notify_function_ddl()))
        for handler in selected:
            for statement in queries.notify_trigger_ddl(conn.dialect, handler.table):
                conn.execute(text(statement))
    return [h.table.name for h in selected]


def remove(app: Outbox, handlers: tuple[str, ...] | list[str] = ()) -> list[str]:
    """Drop the notify trigger of each handler's buffer; returns the tables."""
    _require_postgresql(app)
    selected = app.select_handlers(handlers)
    with app.engine.begin() as conn:
        for handler in selected:
            conn.execute(text(queries.drop_notify_trigger_ddl(conn.dialect, handler.table)))
    return [h.table.name for h in selected]


def ddl(app: Outbox, handlers: tuple[str, ...] | list[str] = ()) -> list[str]:
    """The statements :func:`install` runs, for an application's own migrations.

    Needs no connection: the engine's dialect is enough to quote the names.
    """
    _require_postgresql(app)
    return [queries.notify_function_ddl()] + [
        statement
        for handler in app.select_handlers(handlers)
        for statement in queries.notify_trigger_ddl(app.engine.dialect, handler.table)
    ]


def _require_postgresql(app: Outbox) -> None:
    if not app.supports.listen_notify:
        from outbox.exceptions import ConfigurationError

        raise ConfigurationError(
            f"notifications need PostgreSQL; on {app.dialect} workers find work by polling"
        )
