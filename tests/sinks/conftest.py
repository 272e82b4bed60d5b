"""The sink kinds, as fixtures: each module of ``tests/sinks/kinds`` makes a destination of its
own per test on a real server (or a fake bulk API served from a process of its own)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from outbox import Outbox, Settings
from tests.conftest import reset_schema
from tests.sinks._contract import Downstream
from tests.sinks.kinds.http import http_downstream, recording_api
from tests.sinks.kinds.nats import nats_downstream
from tests.sinks.kinds.rabbitmq import rabbitmq_downstream
from tests.sinks.kinds.redis import redis_downstream

# The kinds the shared contract runs against; each is the fixture ``<kind>_downstream``.
KINDS: list[str] = ["http", "nats", "rabbitmq", "redis"]

__all__ = [
    "http_downstream",
    "nats_downstream",
    "rabbitmq_downstream",
    "recording_api",
    "redis_downstream",
]


@pytest.fixture(params=KINDS)
def downstream(request: pytest.FixtureRequest) -> Downstream:
    """Each sink kind's destination, made for one test."""
    made: Downstream = request.getfixturevalue(f"{request.param}_downstream")
    return made


@pytest.fixture
def app(sqlite_url: str, make_app: Callable[..., Outbox]) -> Outbox:
    """An application on a fresh SQLite database that polls often."""
    reset_schema(sqlite_url)
    made: Outbox = make_app(sqlite_url, Settings(poll_interval=0.05))
    return made


@pytest.fixture(params=["sync", "async"])
def sync(request: pytest.FixtureRequest) -> bool:
    """The sync class of a sink, then the async one."""
    return bool(request.param == "sync")
