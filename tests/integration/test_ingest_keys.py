"""The ingest's idempotency keys are compared exactly on every database: MariaDB's text
collations would take ``K`` for ``k`` and ``k `` for ``k``, and refuse a valid batch of
three producers' keys as a race that never ends."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import func, select

from outbox import Batch, Outbox
from outbox.ops.ingest import ingest
from tests.models import ActivityEvent

KEYS = ["k", "K", "k ", "ké", "ke"]


def test_keys_that_differ_by_case_accent_or_trailing_space_are_distinct(
    database_url: str, make_app: Callable[..., Outbox]
) -> None:
    """Five keys a case, an accent or a trailing space apart: five events, in one batch; the
    same batch again writes nothing and answers each key with its own event."""
    app = make_app(database_url)
    app.handler(ActivityEvent, name="activity")(_ignore)
    first = ingest(app, "activity", [(key, {"activity_id": n}) for n, key in enumerate(KEYS)])
    assert [True] * 5 == [i.created for i in first]
    again = ingest(app, "activity", [(key, {"activity_id": n}) for n, key in enumerate(KEYS)])
    assert [False] * 5 == [i.created for i in again]
    assert [i.event_id for i in first] == [i.event_id for i in again]
    with app.engine.connect() as conn:
        assert 5 == conn.execute(select(func.count()).select_from(ActivityEvent)).scalar_one()


def _ignore(batch: Batch[ActivityEvent]) -> None:
    pass
