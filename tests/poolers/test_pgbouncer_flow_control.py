"""Flow control through PgBouncer in transaction mode.

Every flow-control test that takes a database runs here once more, its database the session's
PostgreSQL reached through the PgBouncer that refuses startup options: deferrals and automatic
pauses, the circuit breaker, shared rate limits (eight threads, and per key), keyed and ordered
groups, the ``pause``, ``held`` and ``work --processes`` commands, and 100,000 events through
the rate-limited bulk API. Pauses, breaker counts, rate-limit reservations and held keys live
in row locks and rows, never in session state, so that a pooler handing each transaction its
own server connection changes nothing.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine

from tests.acceptance import (
    test_bulk_api,
    test_ordered_processes,
    test_pause,
    test_rate_limit_processes,
)
from tests.integration import (
    test_circuit_breaker,
    test_flow_control,
    test_keyed_groups,
    test_ordered_keys,
    test_rate_limits,
)
from tests.poolers._pgbouncer import PgBouncer

pytestmark = [pytest.mark.postgres]

DATABASE_FIXTURES = {"database_url", "server_database"}
MODULES: list[ModuleType] = [
    test_flow_control,
    test_circuit_breaker,
    test_rate_limits,
    test_keyed_groups,
    test_ordered_keys,
    test_pause,
    test_rate_limit_processes,
    test_ordered_processes,
    test_bulk_api,
]


@pytest.fixture
def database_url(postgres_database: str, pgbouncer: PgBouncer) -> str:
    """The session's PostgreSQL database, reset to empty tables, through PgBouncer."""
    return pgbouncer.url


@pytest.fixture
def server_database(database_url: str) -> str:
    """The same: the tests written for each database server take this one."""
    return database_url


@pytest.fixture
def connect() -> Iterator[Callable[[str], Engine]]:
    """The tests' own engines, set up as an application behind a pooler sets up its own:
    psycopg prepares no statements, since the next transaction may run on another server
    connection."""
    engines: list[Engine] = []

    def make(url: str) -> Engine:
        engine = create_engine(url, connect_args={"prepare_threshold": None})
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.dispose()


def _takes_a_database(test: Any) -> bool:
    return bool(DATABASE_FIXTURES & set(inspect.signature(test).parameters))


# The tests themselves, collected here under their own names with this module's fixtures.
globals().update(
    {
        name: test
        for module in MODULES
        for name, test in vars(module).items()
        if name.startswith("test_") and callable(test) and _takes_a_database(test)
    }
)
