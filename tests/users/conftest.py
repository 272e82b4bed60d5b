"""Fixtures of the tier of what users bring: the typed buffer model of each dialect."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from outbox import Outbox
from tests.users import _column_types as types


@pytest.fixture
def dialect(database_url: str) -> str:
    """The name of the database ``database_url`` points at."""
    return types.dialect_of(database_url)


@pytest.fixture
def model(database_url: str, dialect: str, make_app: Callable[[str], Outbox]) -> Iterator[Any]:
    """The dialect's typed buffer model, its table created empty for the test."""
    model = types.buffer_model(dialect)
    engine = make_app(database_url).engine
    types.UsersBase.metadata.drop_all(engine, tables=[model.__table__])
    types.UsersBase.metadata.create_all(engine, tables=[model.__table__])
    yield model
    types.UsersBase.metadata.drop_all(engine, tables=[model.__table__])
