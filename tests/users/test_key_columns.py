"""Every column type a user declares, as the key of keyed groups (``group_by``), ordered keys
(``ordering_key``) and per-key rate limits (``rate_limit_key``), on every dialect.

For each case of ``_column_types``, a handler keyed on that column drains events holding each
of its samples twice, in groups of three: every event is delivered exactly once, none ends
dead; a keyed group holds one key's events; an ordered key's events arrive in id order. A type
a key cannot have is refused when the handler is registered, never found out while running.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from outbox import Batch, ConfigurationError, Outbox, RateLimit, RetryPolicy, schema
from outbox.testing import drain
from tests.users import _column_types as types

OPTIONS = ["group_by", "ordering_key", "rate_limit_key"]
REFUSED = {
    # A float read back may not equal the stored one (MariaDB's FLOAT is single precision), nor
    # a JSON document the stored one; PostgreSQL's json has no equality at all.
    "group_by": {"float", "double_as_decimal", "json", "jsonb"},
    "ordering_key": {"json", "jsonb"},
    "rate_limit_key": set(),
}
EXTRA_OPTIONS: dict[str, dict[str, Any]] = {
    "group_by": {},
    "ordering_key": {},
    "rate_limit_key": {"rate_limit": RateLimit(calls_per_second=10_000)},
}


def _reset(app: Outbox, model: type[Any]) -> list[int]:
    """Empty the buffer and the framework's tables, then write every sample twice; the ids."""
    with app.engine.begin() as conn:
        conn.execute(delete(model))
        for table in reversed(schema.metadata.sorted_tables):
            conn.execute(delete(table))
    dialect = app.dialect
    with Session(app.engine) as session, session.begin():
        rows = types.row_count(dialect)
        session.add_all(types.new_events(model, dialect) + types.new_events(model, dialect, rows))
    with app.engine.connect() as conn:
        return list(conn.execute(select(model.id).order_by(model.id)).scalars())


def _problem(option: str, case: types.ColumnCase, calls: list[list[tuple[int, Any]]],
             ids: list[int], left: int, dead: int) -> str | None:  # fmt: skip
    """What went wrong for one case, or None."""
    delivered = sorted(event_id for call in calls for event_id, _ in call)
    if (delivered, left, dead) != (ids, 0, 0):
        return f"delivered {len(delivered)} of {len(ids)} events, {left} left, {dead} dead"
    if option == "group_by":
        mixed = [call for call in calls if any(not case.same(call[0][1], v) for _, v in call)]
        if mixed:
            return f"groups mixing keys: {[[v for _, v in call] for call in mixed][:2]}"
    if option == "ordering_key":
        seen: list[tuple[Any, list[int]]] = []
        for event_id, value in (event for call in calls for event in call):
            for key, key_ids in seen:
                if case.same(key, value):
                    key_ids.append(event_id)
                    break
            else:
                seen.append((value, [event_id]))
        unordered = [key for key, key_ids in seen if key_ids != sorted(key_ids)]
        if unordered:
            return f"keys out of id order: {unordered[:2]}"
    return None


@pytest.mark.parametrize("option", OPTIONS)
def test_every_column_type_as_a_key(
    option: str,
    database_url: str,
    dialect: str,
    model: type[Any],
    make_app: Callable[[str], Outbox],
) -> None:
    problems: dict[str, str] = {}
    for case in types.cases(dialect):
        app = make_app(database_url)
        ids = _reset(app, model)
        calls: list[list[tuple[int, Any]]] = []

        def handle(batch: Batch[Any], name: str = case.name, calls: list[Any] = calls) -> None:
            calls.append([(event.id, getattr(event, name)) for event in batch.events])

        try:
            app.handler(
                model,
                name="keyed",
                batch_size=3,
                retry=RetryPolicy(max_attempts=1),
                **{option: case.name, **EXTRA_OPTIONS[option]},
            )(handle)
        except ConfigurationError as error:
            if case.name not in REFUSED[option]:
                problems[case.name] = f"refused: {error}"
            continue
        if case.name in REFUSED[option]:
            problems[case.name] = "registered, though the type cannot be a key"
            continue
        drain(app)
        with app.engine.connect() as conn:
            left = conn.execute(select(func.count()).select_from(model)).scalar_one()
            dead = conn.execute(select(func.count()).select_from(schema.archive)).scalar_one()
        found = _problem(option, case, calls, ids, left, dead)
        if found is not None:
            problems[case.name] = found
    assert {} == problems
