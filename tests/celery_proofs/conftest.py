"""Fixtures of the Celery proofs: a broker, and a per-test database with the proof app's
buffer and the record of distribution ticks."""

from __future__ import annotations

import pytest

from tests.celery_proofs._harness import broker_url, reset
from tests.conftest import reset_schema

_DATABASE_FIXTURES = {"postgresql": "postgres_url", "mariadb": "mariadb_url"}


@pytest.fixture
def broker(request: pytest.FixtureRequest) -> str:
    """The URL of the broker named by the parameter (``rabbitmq``, ``redis``)."""
    return broker_url(request.param)


@pytest.fixture
def proof_database(request: pytest.FixtureRequest) -> str:
    """The session's database on the server named by the parameter (``postgresql``,
    ``mariadb``), migrated and empty, with the proof app's buffer."""
    url: str = request.getfixturevalue(_DATABASE_FIXTURES[request.param])
    reset_schema(url)
    reset(url)
    return url
