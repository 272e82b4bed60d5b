"""How outbox sets up SQLite connections: a new connection waits for another's write lock."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from sqlalchemy import text

from outbox import Outbox

HELD_SECONDS = 0.5


def test_a_connection_waits_for_a_write_lock_held_before_the_switch_to_wal(
    tmp_path: Path,
) -> None:
    """A file not yet in WAL whose write lock another process holds (a second `outbox migrate`
    started with the first): the connection waits for the lock instead of failing at once."""
    path = tmp_path / "new.sqlite3"
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    holder.execute("CREATE TABLE taken (x INTEGER)")
    release = threading.Timer(HELD_SECONDS, lambda: holder.execute("COMMIT"))
    release.start()
    app = Outbox(f"sqlite:///{path}")
    try:
        with app.engine.connect() as conn:
            mode = conn.execute(text("PRAGMA journal_mode")).scalar_one()
            tables = conn.execute(text("SELECT name FROM sqlite_master")).scalars().all()
    finally:
        release.join()
        holder.close()
        app.engine.dispose()
    assert ("wal", ["taken"]) == (mode, tables)
