"""Handlers set aside because their buffer table does not exist, and the look that takes them
back once it exists again (a worker's, every rescue interval).

A worker refuses to start when a table is missing; one dropped while it runs sets its handler
aside, whose jobs wait untouched while the others go on.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from outbox._core import log as _log
from outbox._db import missing_buffer_tables
from outbox.app import Outbox
from outbox.handler import Handler


class MissingTables:
    """The handlers of one worker set aside for a missing buffer table. Thread-safe: the job
    threads set aside, the maintenance thread takes back. ``log``: the worker's logger, which
    the lines keep."""

    def __init__(
        self,
        app: Outbox,
        worker_id: str,
        handlers: Mapping[str, Handler[Any]],
        log: _log.Logger,
    ) -> None:
        self.app = app
        self.worker_id = worker_id
        self.handlers = handlers
        self.log = log
        self._lock = threading.Lock()
        self._set_aside: dict[str, str] = {}
        """Handlers whose buffer table was found missing, with the table: not served."""
        self._serving = list(handlers)

    @property
    def missing(self) -> dict[str, str]:
        """The handlers set aside: handler -> table."""
        with self._lock:
            return dict(self._set_aside)

    @property
    def serving(self) -> list[str]:
        """The handlers served: all but those set aside."""
        return self._serving

    def set_aside(self, missing: Mapping[str, str]) -> None:
        """Stop serving these handlers (their tables are missing); one line for each."""
        with self._lock:
            found = {h: t for h, t in missing.items() if h not in self._set_aside}
            self._set_aside.update(found)
            self._serving = [h for h in self.handlers if h not in self._set_aside]
        for name, table in found.items():
            self.log.error(
                _log.BUFFER_TABLE_MISSING, worker=self.worker_id, handler=name, table=table
            )

    def run_once(self) -> bool:
        """Take back the handlers set aside whose tables exist again; whether any came back."""
        with self._lock:
            aside = {h: self.handlers[h].tables for h in self._set_aside}
        if not aside:
            return False
        still = missing_buffer_tables(self.app.engine, aside)
        with self._lock:
            back = {h: t for h, t in self._set_aside.items() if h not in still}
            for name in back:
                del self._set_aside[name]
            self._serving = [h for h in self.handlers if h not in self._set_aside]
        for name, table in back.items():
            self.log.info(_log.BUFFER_TABLE_FOUND, worker=self.worker_id, handler=name, table=table)
        return bool(back)
