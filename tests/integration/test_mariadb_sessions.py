"""What outbox asks of a MariaDB server: a recent enough version, and an end to idle
transactions, as PostgreSQL gives."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from outbox import UnsupportedDatabaseError
from outbox._db import create_outbox_engine
from outbox._db.mysql import connection as mysql_connection


def test_a_server_older_than_outbox_needs_is_refused_in_one_line(
    mariadb_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Connecting to a server below the version outbox needs raises, naming both versions."""
    monkeypatch.setattr(mysql_connection, "MIN_MARIADB_VERSION", (99, 1))
    engine = create_outbox_engine(mariadb_url)
    try:
        with pytest.raises(UnsupportedDatabaseError) as refused, engine.connect():
            pass
    finally:
        engine.dispose()
    message = str(refused.value)
    assert (True, True) == ("MariaDB 99.1 or newer" in message, "this server is 10." in message)


def test_the_server_ends_a_transaction_left_idle_past_the_timeout(mariadb_url: str) -> None:
    """A transaction idle longer than the lease is ended by the server: its locks go with it."""
    engine = create_outbox_engine(mariadb_url, idle_transaction_timeout=1.0)
    try:
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE IF NOT EXISTS idle_probe (id INT PRIMARY KEY)"))
        with engine.connect() as conn:
            setting = conn.execute(text("SELECT @@session.idle_transaction_timeout")).scalar()
            # A locking read: the transaction holds a lock, as a claim's does.
            conn.execute(text("SELECT id FROM idle_probe WHERE id = 1 FOR UPDATE"))
            time.sleep(2.5)
            with pytest.raises(OperationalError):
                conn.execute(text("SELECT 1"))
    finally:
        engine.dispose()
    assert 1 == setting
