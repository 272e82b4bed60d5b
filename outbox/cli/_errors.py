"""outbox's errors as one line and an exit code; the checks every command makes first."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

import click
from sqlalchemy.exc import OperationalError, SQLAlchemyError

from outbox.app import Outbox
from outbox.cli._context import Context
from outbox.exceptions import (
    BufferTableMissingError,
    ConfigurationError,
    DatabaseUnavailableError,
    DownstreamUnavailableError,
    OutboxError,
    SchemaMissingError,
)
from outbox.ops import database
from outbox.ops.progress import StoppedError

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_INTERRUPTED = 130
"""Stopped by Ctrl-C (SIGINT) between two batches: 128 + SIGINT, as a shell reports it."""


def fail(message: str, code: int) -> NoReturn:
    click.echo(f"Error: {message}", err=True)
    sys.exit(code)


def exit_interrupted(done: str) -> NoReturn:
    """Say what a command stopped by Ctrl-C did, and exit with :data:`EXIT_INTERRUPTED`."""
    click.echo(f"{done}; run it again to go on", err=True)
    sys.exit(EXIT_INTERRUPTED)


@contextmanager
def exits_on_errors() -> Iterator[None]:
    """Map outbox's errors to messages and exit codes."""
    try:
        yield
    except StoppedError as stopped:
        exit_interrupted(f"{stopped.summary}; stopped by Ctrl-C before the rest")
    except (OutboxError, OperationalError) as error:
        fail(*said(error))


def said(error: OutboxError | SQLAlchemyError) -> tuple[str, int]:
    """The one line an error of outbox's or the database's is said in, and its exit code."""
    if isinstance(error, ConfigurationError):
        return str(error), EXIT_USAGE
    if isinstance(error, DatabaseUnavailableError | DownstreamUnavailableError):
        return str(error), EXIT_UNREACHABLE
    if isinstance(error, SQLAlchemyError):
        return f"database error: {database.error_summary(error)}", EXIT_FAILURE
    return str(error), EXIT_FAILURE


@contextmanager
def named_database(app: Outbox) -> Iterator[None]:
    """An error met on one of the databases of an application serving several names it."""
    try:
        yield
    except OutboxError as error:
        if app.database_name is not None and error.args:
            error.args = (f"database {app.database_name!r}: {error.args[0]}", *error.args[1:])
        raise


def ready(app: Outbox, handlers: tuple[str, ...] | None = None) -> Outbox:
    """Connect and check the tables, so that problems surface as one clear message: tables
    missing from a schema that records an older generation (or one that needs newer workers)
    are refused naming both generations.

    ``handlers``: also check the buffer tables of these handlers (all when empty).
    """
    try:
        database.check_schema(app.engine)
    except SchemaMissingError as missing:
        older = database.recorded_incompatibility(app.engine)
        if older is not None:
            raise older from missing
        raise
    check_schema_revision(app)
    if handlers is not None:
        check_buffers(app, handlers)
    return app


def check_schema_revision(app: Outbox) -> None:
    """Refuse tables a newer outbox migrated past the revisions this one ships."""
    from outbox.ops.revisions import check_revision

    check_revision(app.engine)


def check_buffers(app: Outbox, handlers: tuple[str, ...]) -> None:
    """Refuse to run when a buffer table of the handlers (all when none) does not exist: a
    deploy that has not created it. The message names the handlers that could run alone."""
    selected = app.select_handlers(handlers)
    try:
        database.check_buffer_tables(app.engine, {h.name: h.tables for h in selected})
    except BufferTableMissingError as error:
        others = [h.name for h in selected if h.name not in error.missing]
        message = str(error)
        if others:
            message += "; " + " ".join(f"--handler {name}" for name in others)
            message += " selects the others"
        fail(message, EXIT_FAILURE)


def command(func: Callable[..., Any]) -> Callable[..., Any]:
    """Run a command inside the error mapping, with the shared Context."""

    @click.pass_obj
    def wrapper(ctx: Context, *args: Any, **kwargs: Any) -> Any:
        with exits_on_errors():
            return func(ctx, *args, **kwargs)

    wrapper.__name__ = func.__name__
    wrapper.__doc__ = func.__doc__
    return wrapper
