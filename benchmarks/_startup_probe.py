"""The ``outbox`` command with marks along its start-up, for :mod:`benchmarks.startup`.

    python -m benchmarks._startup_probe --app ... work --burst ...

Runs the same ``main`` as the ``outbox`` script, and writes to stderr, as JSON lines the
benchmark reads beside the command's own log lines, where the time went: when the interpreter
reached this module, when ``outbox`` and its command were imported, when the application's module
was, when each process was forked, and every SQL statement sent (its first words), each with
the monotonic clock (shared by every process of the machine) and the process's CPU seconds.
Nothing in outbox is changed: the application's import is timed by wrapping the command's
loader, the statements by a SQLAlchemy event on every engine.
"""

from __future__ import annotations

import json
import os
import sys
import time


def mark(what: str, **fields: object) -> None:
    """One mark: what, when (monotonic seconds), this process's CPU seconds so far."""
    times = os.times()
    line = {"probe": what, "t": time.monotonic(), "cpu": times.user + times.system, **fields}
    os.write(2, (json.dumps(line) + "\n").encode())


mark("interpreter", pid=os.getpid())

import outbox  # noqa: E402 - the import is what is timed

mark("import outbox")

import outbox.cli  # noqa: E402
from outbox.cli import _context  # noqa: E402

mark("import outbox.cli")

from sqlalchemy import event  # noqa: E402
from sqlalchemy.engine import Engine  # noqa: E402

_load_app = _context.load_app


def _timed_load_app(*args: object, **kwargs: object) -> object:
    mark("app import start")
    try:
        return _load_app(*args, **kwargs)  # type: ignore[arg-type]
    finally:
        mark("app imported")


_context.load_app = _timed_load_app  # type: ignore[assignment]


@event.listens_for(Engine, "connect")
def _connected(dbapi_connection: object, record: object) -> None:
    mark("connect")


@event.listens_for(Engine, "before_cursor_execute")
def _statement(
    conn: object, cursor: object, statement: str, parameters: object, context: object, many: bool
) -> None:
    mark("statement", sql=" ".join(statement.split())[:90])


os.register_at_fork(after_in_child=lambda: mark("forked", pid=os.getpid()))

sys.argv[0] = "outbox"
outbox.cli.main()
