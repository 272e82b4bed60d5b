"""A migration waiting for a lock behind a long reader holds up workers no longer than its lock
timeout: it gives up the wait, tries again after a pause, and at last names the holder.

The migration is 0002 -> head, whose 0003 adds a column to outbox_jobs: an exclusive lock on
the table workers read and write most."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from sqlalchemy import Connection, Engine, func, select

from outbox import schema
from outbox.ops.migrate import current_revision, head_revision, migrate
from tests._support import wait_for
from tests.acceptance._cli import Cli

LOCK_TIMEOUT = "1"
WORKER_PATIENCE_SECONDS = 20.0
"""Far longer than the lock timeout: a worker still queued after it was queued without bound."""


@contextmanager
def _reader(engine: Engine) -> Iterator[Connection]:
    """A transaction that has read outbox_jobs and stays open (a report, a stuck session)."""
    with engine.connect() as conn, conn.begin():
        conn.execute(select(func.count()).select_from(schema.jobs)).scalar_one()
        yield conn


def _session_id(conn: Connection) -> int:
    name = "pg_backend_pid" if conn.dialect.name == "postgresql" else "connection_id"
    return int(conn.execute(select(getattr(func, name)())).scalar_one())


def _alter_waiting(engine: Engine) -> bool:
    """Whether a session's ALTER TABLE outbox_jobs is waiting for a lock."""
    with engine.connect() as conn:
        if conn.dialect.name == "postgresql":
            sql = (
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND query LIKE 'ALTER TABLE outbox_jobs%%'"
            )
        else:
            sql = (
                "SELECT COUNT(*) FROM information_schema.PROCESSLIST"
                " WHERE STATE LIKE 'Waiting for table metadata lock'"
                " AND INFO LIKE 'ALTER TABLE outbox_jobs%%'"
            )
        return bool(conn.exec_driver_sql(sql).scalar())


def _worker_query(engine: Engine, done: threading.Event) -> None:
    """What a worker does first: pick a free job, skipping locked ones."""
    pick = (
        select(schema.jobs.c.id)
        .where(schema.jobs.c.lease_token.is_(None))
        .order_by(schema.jobs.c.priority, schema.jobs.c.run_at, schema.jobs.c.id)
        .limit(1)
        .with_for_update(skip_locked=True)
    )
    with engine.begin() as conn:
        conn.execute(pick).all()
    done.set()


def test_workers_wait_behind_a_waiting_migration_no_longer_than_its_lock_timeout(
    cli: Cli, empty_server_url: str, engine_on: Callable[[str], Engine]
) -> None:
    """With a reader open, a worker's query queued behind the migration's lock wait completes
    before the reader ends; the migration then completes on a later try."""
    engine, worker = engine_on(empty_server_url), engine_on(empty_server_url)
    migrate(engine, "0002")
    done = threading.Event()
    with _reader(engine_on(empty_server_url)):
        running = cli.start(
            "--database-url", empty_server_url, "migrate", "--lock-timeout", LOCK_TIMEOUT
        )
        wait_for(lambda: _alter_waiting(engine), "the migration waiting for its lock")
        threading.Thread(target=_worker_query, args=(worker, done), daemon=True).start()
        finished_while_reader_open = done.wait(WORKER_PATIENCE_SECONDS)
    result = running.result()

    assert (True, 0, head_revision()) == (
        finished_while_reader_open,
        result.code,
        current_revision(engine),
    )
    assert "rolled back, trying again" in result.stderr


def test_migrate_gives_up_in_one_line_naming_the_table_and_its_holder(
    cli: Cli, empty_server_url: str, engine_on: Callable[[str], Engine]
) -> None:
    """A reader open through every try: exit 1, one error line naming outbox_jobs and the
    reader's session, the tables left at 0002."""
    engine = engine_on(empty_server_url)
    migrate(engine, "0002")
    with _reader(engine_on(empty_server_url)) as reader:
        result = cli.run(
            "--database-url", empty_server_url, "migrate", "--lock-timeout", LOCK_TIMEOUT
        )
        holder = _session_id(reader)

    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    expected = (
        "Error: gave up the upgrade to revision 0003 after 4 tries: it waited 1 s each time "
        f"for a lock on outbox_jobs, held by session {holder}, transaction open "
    )
    assert (1, 1, "0002") == (result.code, len(errors), current_revision(engine))
    assert expected == errors[0][: len(expected)]
    assert "Traceback" not in result.stderr
