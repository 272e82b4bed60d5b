"""The inbox consumer example runs end to end on SQLite and PostgreSQL, on the shared Redis,
and does what its README promises: every order billed once, a re-send acknowledged without
effect, an entry without an id refused to the dead stream."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from examples.inbox_consumer import run as inbox_consumer_run
from tests.conftest import reset_schema
from tests.sinks._contract import require_service
from tests.sinks.kinds.redis import redis_url

REPOSITORY = Path(__file__).resolve().parents[2]
EXPECTED = {
    "orders placed": 200,
    "messages received": 202,
    "invoices": 200,
    "repeats acknowledged without effect": 1,
    "refused (no id)": 1,
    "dead stream entries": 1,
}


@pytest.fixture(autouse=True)
def _redis() -> None:
    parts = urlsplit(redis_url())
    require_service("Redis", parts.hostname or "127.0.0.1", parts.port or 6379)


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_every_order_is_billed_once(
    database: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """200 orders, a re-send and an entry without an id: 200 invoices, one repeat, one refusal."""
    if database == "postgresql":
        url: str = request.getfixturevalue("postgres_url")
        reset_schema(url)
    else:
        url = f"sqlite:///{tmp_path}/inbox_consumer.sqlite3"
    assert EXPECTED == inbox_consumer_run.main(url)


def test_run_py_runs_as_a_module(tmp_path: Path) -> None:
    """``python -m examples.inbox_consumer.run`` exits 0 and prints its summary."""
    env = {
        **os.environ,
        "OUTBOX_DATABASE_URL": f"sqlite:///{tmp_path}/inbox_consumer.sqlite3",
        "EXAMPLE_STREAM": f"shop-orders-{tmp_path.name}",
    }
    completed = subprocess.run(
        [sys.executable, "-m", "examples.inbox_consumer.run"],
        cwd=REPOSITORY,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert 0 == completed.returncode, completed.stderr
    assert "invoices: 200" in completed.stdout
