"""The listener: on PostgreSQL, a thread LISTENs on the ``outbox`` channel so that a worker
wakes at once when events are committed (``outbox.ops.notify`` installs the triggers that
NOTIFY)."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from typing import Any

from outbox._core import log as _log
from outbox._db import queries
from outbox.app import Outbox

log = _log.get_logger(__name__)

LISTEN_TIMEOUT_SECONDS = 1.0
MAX_RECONNECT_SECONDS = 30.0


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
