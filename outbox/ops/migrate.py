"""Applying the framework's alembic migrations (``outbox migrate``), up or down.

The migrations keep their own version table, ``outbox_alembic_version``, so they never collide
with the application's own alembic history. The scripts ship inside the wheel.

A run holds the database's migration lock (one run at a time; another waits for it), then
applies one revision per transaction. Every lock a revision's statements wait for is waited
for at most the lock timeout, so that workers queue behind a migration no longer than that: a
revision that times out is rolled back and tried again after a pause, a few times, then the
run gives up naming the table and who holds it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import Script, ScriptDirectory
from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError

from outbox._core.durations import duration
from outbox._db import migration
from outbox.exceptions import ConfigurationError, OutboxError
from outbox.ops.progress import Phase, Progress, StoppedError
from outbox.ops.revisions import VERSION_TABLE as VERSION_TABLE
from outbox.ops.revisions import NewerSchemaError as NewerSchemaError
from outbox.ops.revisions import check_revision as check_revision
from outbox.ops.revisions import migrations_dir as migrations_dir

DEFAULT_LOCK_TIMEOUT_SECONDS = 5.0
"""How long a migration statement waits for a lock (float seconds) before its revision is
rolled back and tried again: also the longest workers queue behind it."""
RETRY_PAUSES = (0.5, 1.0, 2.0)
"""The pauses between the tries of a revision that timed out on a lock, as multiples of the
lock timeout: four tries in all."""
RUN_LOCK_WAIT_SECONDS = 600.0
"""How long a run waits for another run of ``outbox migrate`` on the same database to end."""
BASE = "base"
"""``--to base``: no outbox table at all."""


class DowngradeRefusedError(OutboxError):
    """A downgrade would drop rows, and dropping them was not accepted."""


class LockWaitError(OutboxError):
    """A revision waited for a lock past the lock timeout on every try."""


class MigrationBusyError(OutboxError):
    """Another ``outbox migrate`` held the migration lock past the wait."""


def alembic_config(engine: Engine) -> Config:
    """An alembic Config that runs outbox's migrations on ``engine``."""
    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    config.attributes["engine"] = engine
    return config


def _scripts() -> ScriptDirectory:
    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    return ScriptDirectory.from_config(config)


def head_revision(engine: Engine | None = None) -> str | None:
    """The newest migration outbox ships."""
    return _scripts().get_current_head()


def known_revisions() -> list[str]:
    """The revisions outbox ships, oldest first."""
    return [script.revision for script in reversed(list(_scripts().walk_revisions()))]


def current_revision(engine: Engine) -> str | None:
    """The migration the database is at; None before the first ``outbox migrate``."""
    with engine.connect() as conn:
        return _revision_on(conn)


def _revision_on(conn: Connection) -> str | None:
    context = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
    return context.get_current_revision()


def _check_known(revision: str | None) -> None:
    known = known_revisions()
    if revision is not None and revision not in known:
        raise NewerSchemaError(revision, known[-1] if known else None)


def upgrade(engine: Engine, revision: str = "head") -> tuple[str | None, str | None]:
    """Migrate the database to ``revision``; a no-op when it is there. Returns (before, after)."""
    return migrate(engine, revision)


def migrate(
    engine: Engine,
    to: str = "head",
    *,
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT_SECONDS,
    accept_losses: bool = False,
    on_retry: Callable[[str], None] | None = None,
    progress: Progress | None = None,
) -> tuple[str | None, str | None]:
    """Migrate the database up or down to revision ``to`` (``head``, a revision, or ``base``:
    no outbox table), one revision per transaction. Returns (before, after).

    A downgrade that would drop rows raises DowngradeRefusedError naming them, unless
    ``accept_losses``. ``lock_timeout`` (float seconds): see :data:`DEFAULT_LOCK_TIMEOUT_SECONDS`;
    ``on_retry`` is told, in one line, of each revision put off for a lock.

    ``progress`` (:class:`~outbox.ops.progress.Progress`) is told the revisions to apply and each
    one applied: a revision is one transaction, whose statements (a table rewritten, say)
    report nothing while they run. When it asks to stop,
    :class:`~outbox.ops.progress.StoppedError` is raised between two revisions; on SQLite, whose
    run is one transaction, none of the run's revisions stays.
    """
    target = _resolve(to)
    try:
        with migration.run_lock(engine, RUN_LOCK_WAIT_SECONDS) as shared:
            before = _read_revision(engine, shared)
            _check_known(before)
            steps = _steps(before, target)
            if steps and steps[0][0] == "down" and not accept_losses:
                _refuse_losses(engine if shared is None else shared, before, target, steps)
            phase = Phase(progress, "migrated", "revisions", len(steps))
            for direction, script in steps:
                if shared is not None and phase.progress.should_stop():
                    # SQLite: the run is one transaction, rolled back whole; none stays.
                    raise StoppedError(phase.verb, phase.noun, 0, phase.total)
                phase.check()
                if shared is None:
                    _apply(engine, direction, script, lock_timeout, on_retry)
                else:
                    _run_on(shared, direction, script)
                phase.advance(1)
            phase.end()
            return before, _read_revision(engine, shared)
    except migration.RunLockTimeoutError as error:
        holder = f" (session {error.holder})" if error.holder is not None else ""
        raise MigrationBusyError(
            f"another `outbox migrate`{holder} has held this database's migration lock for more "
            f"than {RUN_LOCK_WAIT_SECONDS:g} s; let it finish, then run `outbox migrate` again"
        ) from None


def _read_revision(engine: Engine, shared: Connection | None) -> str | None:
    return current_revision(engine) if shared is None else _revision_on(shared)


def _resolve(to: str) -> str | None:
    """The revision ``to`` names (None: base); ConfigurationError for one outbox does not ship."""
    if to == BASE:
        return None
    if to == "head":
        return head_revision()
    known = known_revisions()
    if to not in known:
        raise ConfigurationError(
            f"unknown revision {to!r}: this outbox knows {', '.join(known)}, head and base"
        )
    return to


def _steps(current: str | None, target: str | None) -> list[tuple[str, Script]]:
    """The revisions to apply, in order: ("up", revision) or ("down", revision to undo)."""
    known = known_revisions()
    at = known.index(current) + 1 if current is not None else 0
    goal = known.index(target) + 1 if target is not None else 0
    scripts = _scripts()
    if goal >= at:
        return [("up", scripts.get_revision(r)) for r in known[at:goal]]
    return [("down", scripts.get_revision(r)) for r in reversed(known[goal:at])]


def _refuse_losses(
    connectable: Engine | Connection,
    current: str | None,
    target: str | None,
    steps: Sequence[tuple[str, Script]],
) -> None:
    """Raise DowngradeRefusedError naming what the downgrade would drop, if anything."""
    parts: list[str] = []
    with _connection(connectable) as conn:
        for _, script in steps:
            losses = migration.downgrade_losses(conn, script.revision)
            by_place: dict[str, list[str]] = {}
            for loss in losses:
                by_place.setdefault(loss.where, []).append(f"{loss.count} {loss.noun}")
            parts.extend(f"{where}: {', '.join(nouns)}" for where, nouns in by_place.items())
    if parts:
        raise DowngradeRefusedError(
            f"{current} -> {target or BASE} drops {'; '.join(parts)}; "
            "pass --yes to downgrade all the same"
        )


def _apply(
    engine: Engine,
    direction: str,
    script: Script,
    lock_timeout: float,
    on_retry: Callable[[str], None] | None,
) -> None:
    """Apply one revision (or undo it) in a transaction of its own, tried again after a pause
    when it gave up waiting for a lock."""
    tries = len(RETRY_PAUSES) + 1
    for attempt in range(1, tries + 1):
        try:
            _run_step(engine, direction, script, lock_timeout)
            return
        except DBAPIError as error:
            if not migration.is_lock_timeout(error):
                raise
            table = migration.table_waited_for(error)
            if attempt == tries:
                line = _gave_up(engine, script, direction, table, lock_timeout, tries)
                raise LockWaitError(line) from error
            pause = RETRY_PAUSES[attempt - 1] * lock_timeout
            if on_retry is not None:
                on_retry(
                    f"revision {script.revision} waited {lock_timeout:g} s for a lock on "
                    f"{table or 'a table'}: rolled back, trying again in {pause:g} s "
                    f"(try {attempt + 1} of {tries})"
                )
            time.sleep(pause)


def _run_step(engine: Engine, direction: str, script: Script, lock_timeout: float) -> None:
    with engine.connect() as conn:
        migration.rerunnable_ddl(conn)
        with conn.begin(), migration.bounded_lock_waits(conn, lock_timeout):
            _run_on(conn, direction, script)


def _run_on(conn: Connection, direction: str, script: Script) -> None:
    """Apply ``script`` (or undo it) on ``conn``, in the transaction it is in."""
    config = alembic_config(conn.engine)
    config.attributes["connection"] = conn
    if direction == "up":
        command.upgrade(config, script.revision)
    else:
        down = script.down_revision
        command.downgrade(config, down if isinstance(down, str) else BASE)


@contextmanager
def _connection(connectable: Engine | Connection) -> Iterator[Connection]:
    if isinstance(connectable, Connection):
        yield connectable
        return
    with connectable.connect() as conn:
        yield conn


def _gave_up(
    engine: Engine,
    script: Script,
    direction: str,
    table: str | None,
    lock_timeout: float,
    tries: int,
) -> str:
    """The one line of a revision that timed out on a lock on every try."""
    holders = migration.lock_holders(engine, table)
    held = ""
    if holders:
        holder = holders[0]
        opened = "" if holder.seconds is None else f", transaction open {duration(holder.seconds)}"
        query = f": {holder.query}" if holder.query else ""
        held = f", held by session {holder.pid}{opened}{query}"
    what = "upgrade to" if direction == "up" else "downgrade from"
    stays = current_revision(engine)
    return (
        f"gave up the {what} revision {script.revision} after {tries} tries: it waited "
        f"{lock_timeout:g} s each time for a lock on {table or 'a table'}{held}; the tables stay "
        f"at revision {stays or 'none'}; end that transaction, or run `outbox migrate` again"
    )
