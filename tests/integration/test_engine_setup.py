"""How outbox sets up PostgreSQL connections: a UTC session is named plainly ``UTC``."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy import create_engine, text

from outbox import Outbox

pytestmark = pytest.mark.postgres


def _with_time_zone(url: str, zone: str) -> str:
    return f"{url}?options=-c%20TimeZone%3D{zone.replace('/', '%2F')}"


@pytest.mark.parametrize("own_engine", [False, True], ids=["url", "engine"])
def test_utc_under_another_name_is_named_utc(postgres_url: str, own_engine: bool) -> None:
    """Etc/UTC becomes UTC on every connection (a rolled-back checkout keeps it), and
    timestamptz values come back with Python's own UTC, as the same instants."""
    url = _with_time_zone(postgres_url, "Etc/UTC")
    app = Outbox(engine=create_engine(url)) if own_engine else Outbox(url)
    try:
        for _ in range(2):  # the second checkout follows the pool's rollback of the first
            with app.engine.connect() as conn:
                assert "UTC" == conn.execute(text("SHOW TimeZone")).scalar_one()
                value = conn.execute(
                    text("SELECT timestamptz '2026-01-02 03:04:05+01'")
                ).scalar_one()
                conn.rollback()
        assert UTC is value.tzinfo
        assert datetime(2026, 1, 2, 2, 4, 5, tzinfo=UTC) == value
    finally:
        app.engine.dispose()


def test_other_time_zones_are_left_alone(postgres_url: str) -> None:
    """A session in a real local zone keeps it: values and date arithmetic stay the server's."""
    app = Outbox(_with_time_zone(postgres_url, "Europe/Paris"))
    try:
        with app.engine.connect() as conn:
            assert "Europe/Paris" == conn.execute(text("SHOW TimeZone")).scalar_one()
    finally:
        app.engine.dispose()
