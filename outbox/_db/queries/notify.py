"""PostgreSQL notifications: the trigger DDL and the jobs channel."""

from __future__ import annotations

from sqlalchemy import (
    Connection,
    Table,
    func,
    select,
)
from sqlalchemy.engine import Dialect as SADialect

NOTIFY_CHANNEL = "outbox"
NOTIFY_FUNCTION = "outbox_notify"
JOBS_NOTIFICATION = "outbox_jobs"


def notify_function_ddl() -> str:
    """The trigger function that announces new events on the ``outbox`` channel.

    NOTIFY is transactional: listeners hear it only once the inserting transaction commits,
    and notifications with the same payload within one transaction are delivered once.
    """
    return (
        f"CREATE OR REPLACE FUNCTION {NOTIFY_FUNCTION}() RETURNS trigger LANGUAGE plpgsql AS $$ "
        f"BEGIN PERFORM pg_notify('{NOTIFY_CHANNEL}', TG_TABLE_NAME); RETURN NULL; END $$"
    )


def notify_trigger_ddl(dialect: SADialect, table: Table) -> list[str]:
    """Statements that (re)create a buffer's notify trigger: once per INSERT statement, not row."""
    quote = dialect.identifier_preparer
    trigger = quote.quote(f"{NOTIFY_FUNCTION}_{table.name}"[:63])
    target = quote.format_table(table)
    return [
        f"DROP TRIGGER IF EXISTS {trigger} ON {target}",
        f"CREATE TRIGGER {trigger} AFTER INSERT ON {target} "
        f"FOR EACH STATEMENT EXECUTE FUNCTION {NOTIFY_FUNCTION}()",
    ]


def drop_notify_trigger_ddl(dialect: SADialect, table: Table) -> str:
    """The statement that removes a buffer's notify trigger."""
    quote = dialect.identifier_preparer
    trigger = quote.quote(f"{NOTIFY_FUNCTION}_{table.name}"[:63])
    return f"DROP TRIGGER IF EXISTS {trigger} ON {quote.format_table(table)}"


def notify_jobs(conn: Connection) -> None:
    """Wake idle workers: new jobs are waiting (sent at commit, PostgreSQL only)."""
    conn.execute(select(func.pg_notify(NOTIFY_CHANNEL, JOBS_NOTIFICATION)))
