"""Size-or-time batches: with max_wait, a partial batch waits until its oldest event is due."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import update

from outbox import Outbox
from outbox._db.dialects import db_now_plus
from outbox._engine import claimer, distributor
from tests.models import ActivityEvent


def _app(url: str, make_app: Callable[[str], Outbox]) -> Outbox:
    app = make_app(url)
    app.handler(ActivityEvent, batch_size=10, max_wait=60.0, name="patient")(lambda b: None)
    return app


def test_partial_batch_waits_for_max_wait(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Callable[..., list[int]]
) -> None:
    """Fresh events short of a batch get no claim job and no claim."""
    app = _app(database_url, make_app)
    commit_events(app.engine, 4)
    (distribution,) = distributor.run_once(app)
    claim = claimer.run_once(app, app.get_handler("patient"))
    assert (0, None) == (distribution.enqueued, claim)


def test_full_batch_is_claimed_at_once(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Callable[..., list[int]]
) -> None:
    """A full batch does not wait: one claim job for it, none for the fresh remainder."""
    app = _app(database_url, make_app)
    commit_events(app.engine, 14)
    (distribution,) = distributor.run_once(app)
    claim = claimer.run_once(app, app.get_handler("patient"))
    assert (1, 10) == (distribution.enqueued, claim.size if claim else 0)


def test_partial_batch_is_claimed_once_its_oldest_waited(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Callable[..., list[int]]
) -> None:
    """When the oldest event has waited max_wait, the partial batch is claimed."""
    app = _app(database_url, make_app)
    commit_events(app.engine, 4)
    with app.engine.begin() as conn:
        conn.execute(update(ActivityEvent).values(created_at=db_now_plus(-61)))
    (distribution,) = distributor.run_once(app)
    claim = claimer.run_once(app, app.get_handler("patient"))
    assert (1, 4) == (distribution.enqueued, claim.size if claim else 0)
