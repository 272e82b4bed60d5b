"""A worker backing off after a database error: a database it could not reach that answers
again ends the wait; one that answered all along (the statement itself failed) does not."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
from sqlalchemy.engine import make_url

from outbox import Outbox
from outbox._core import log as _log
from outbox._services.outage import Outage
from tests._proxy import Proxy
from tests._support import wait_for
from tests.models import ActivityEvent

pytestmark = pytest.mark.postgres
log = _log.get_logger(__name__)
LONG_WAIT_SECONDS = 120.0


def _backing_off(app: Outbox, seconds: float) -> threading.Thread:
    outage = Outage("worker-1", log)
    thread = threading.Thread(
        target=outage.back_off, args=(app.engine, seconds, threading.Event()), daemon=True
    )
    thread.start()
    return thread


def test_a_database_that_comes_back_ends_the_wait(
    postgres_database: str, make_app: Callable[..., Outbox]
) -> None:
    """Unreachable when the wait starts, back a few seconds later: the worker goes on then,
    not two minutes later."""
    url = make_url(postgres_database)
    with Proxy(url.host or "127.0.0.1", url.port or 5432) as proxy:
        app = make_app(url.set(host="127.0.0.1", port=proxy.port))
        app.handler(ActivityEvent, name="noop")(lambda batch: None)
        proxy.pause()
        waiting = _backing_off(app, LONG_WAIT_SECONDS)
        time.sleep(2.0)
        still_waiting = waiting.is_alive()
        proxy.resume()
        wait_for(lambda: not waiting.is_alive(), "the wait to end once the database answers")
    assert True is still_waiting


def test_a_database_that_answered_all_along_keeps_the_whole_wait(
    postgres_database: str, make_app: Callable[..., Outbox]
) -> None:
    """The database answers: the error was the statement's own, and the wait is kept whole."""
    app = make_app(postgres_database)
    app.handler(ActivityEvent, name="noop")(lambda batch: None)
    started = time.monotonic()
    _backing_off(app, 2.5).join()
    assert 2.5 <= time.monotonic() - started
