"""The archive's retention through PgBouncer in transaction mode: its one-cleaner lock is a
transaction's, so a pooler handing each transaction another server connection neither lets two
cleaners in nor leaves the lock held on a connection it hands on."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from sqlalchemy import Engine, text

from outbox import Outbox, Settings
from outbox._db import queries
from outbox._services.retention import Retention
from outbox.ops.migrate import migrate

pytestmark = [pytest.mark.postgres]


def test_passes_through_a_transaction_pooler_take_turns_and_leave_no_lock(
    empty_pooled_url: str, postgres_url: str, connect: Callable[[str], Engine]
) -> None:
    """While a client of the pooler holds the cleaners' lock in its transaction, a pass does
    nothing; after it, passes run one after another, and no advisory lock stays held on any
    server connection."""
    admin = connect(postgres_url)
    migrate(admin)
    app = Outbox(empty_pooled_url, settings=Settings(archive_retention_days=2))
    holder = connect(empty_pooled_url)
    try:
        with holder.connect() as conn, conn.begin(), queries.retention_lock(conn) as held:
            busy = Retention(app).run_once()
        passes = [Retention(app).run_once().ran for _ in range(5)]
    finally:
        app.engine.dispose()
    with admin.connect() as conn:
        advisory = conn.execute(
            text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'")
        ).scalar_one()
    assert (True, False, [True] * 5, 0) == (held, busy.ran, passes, advisory)
