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

import random
import threading
from collections.abc import Callable
from typing import Any

from sqlalchemy import text

from outbox import _log
from outbox._db import queries
from outbox.app import Outbox

log = _log.get_logger(__name__)

LISTEN_TIMEOUT_SECONDS = 1.0
MAX_RECONNECT_SECONDS = 30.0


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


class Listener:
    """A thread that LISTENs on the ``outbox`` channel and calls ``on_notify(payload)``.

    It holds one connection of the engine's pool for itself (and never gives it back: a
    listening connection must not serve other work), reconnects with a capped, jittered
    backoff when the connection drops, and stops when :meth:`stop` is called.
    """

    def __init__(self, app: Outbox, on_notify: Callable[[str], None]) -> None:
        self.app = app
        self.on_notify = on_notify
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="outbox-listener", daemon=True)
        self.listening = threading.Event()
        """Set while a LISTEN is in place (tests wait on it)."""

    def start(self) -> None:
        """Start listening in the background."""
        self._thread.start()

    def stop(self) -> None:
        """Stop listening; returns at once, the thread ends within a second."""
        self._stop.set()

    def _main(self) -> None:
        backoff = 0.0
        while not self._stop.is_set():
            raw: Any = None
            try:
                raw = self.app.engine.raw_connection()
                connection = raw.driver_connection
                connection.autocommit = True
                connection.execute(f"LISTEN {queries.NOTIFY_CHANNEL}")
                self.listening.set()
                backoff = 0.0
                while not self._stop.is_set():
                    for notification in connection.notifies(timeout=LISTEN_TIMEOUT_SECONDS):
                        self.on_notify(notification.payload)
            except Exception as error:  # a dropped connection: listen again after a pause
                self.listening.clear()
                if not self._stop.is_set():
                    backoff = min(max(backoff * 2, 0.5), MAX_RECONNECT_SECONDS)
                    log.warning(_log.LISTENER_RECONNECTING, error=str(error).splitlines()[0])
                    self._stop.wait(backoff * (0.5 + random.random()))
            finally:
                self.listening.clear()
                if raw is not None:
                    raw.invalidate()
