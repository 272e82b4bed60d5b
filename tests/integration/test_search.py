"""Where something is (``outbox.ops.search``): an event id, a group id, an ordering key and an
ingest key, each found in the buffer, a group with a job, a dead group or the archive, on
SQLite, PostgreSQL and MariaDB."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import Index, String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from outbox import Batch, BufferMixin, Outbox, RetryPolicy
from outbox.exceptions import ConfigurationError
from outbox.ops import group_operations, groups, ingest, search
from outbox.ops.search import Place, Taken
from outbox.ops.selection import Selection
from outbox.testing import drain
from tests.models import ActivityEvent, EmailEvent

ONE_SHOT = RetryPolicy(max_attempts=1)
LATER = RetryPolicy(max_attempts=3, base_delay=3600.0, max_delay=3600.0)


class _KeyedBase(DeclarativeBase):
    pass


class KeyedEvent(BufferMixin, _KeyedBase):
    """A buffer whose ordering key has an index of its own."""

    __tablename__ = "test_search_keyed_events"
    account: Mapped[str] = mapped_column(String(40))
    __table_args__ = (
        *BufferMixin.buffer_indexes("test_search_keyed_events"),
        Index("ix_test_search_keyed_events_account", "account"),
    )


def _fail(batch: Batch[Any]) -> None:
    raise ValueError("the downstream said no")


def _found(result: search.SearchResult) -> set[tuple[Any, ...]]:
    return {(f.taken, f.place, f.handler, f.group_id, f.event_id, f.status) for f in result.found}


@pytest.fixture
def app(database_url: str, make_app: Callable[[str], Outbox]) -> Outbox:
    """``dead`` dead-letters at once, ``later`` retries in an hour."""
    app = make_app(database_url)
    app.handler(ActivityEvent, batch_size=5, retry=ONE_SHOT, name="dead")(_fail)
    app.handler(EmailEvent, batch_size=5, retry=LATER, name="later")(_fail)
    return app


def test_an_event_id_is_found_in_its_buffer_its_group_and_the_archive(
    app: Outbox, commit_events: Any
) -> None:
    """A dead event is in the archive (dead), a retrying one in its group, a new one in the
    buffer, in no group; the note says how far the archive was searched."""
    [dead_event] = commit_events(app.engine, 1)
    [retried] = commit_events(app.engine, 1, EmailEvent)
    drain(app)
    [waiting] = commit_events(app.engine, 1)
    dead_group = groups.find(app, Selection(handlers=("dead",))).groups[0].group_id
    retry_group = groups.find(app, Selection(handlers=("later",))).groups[0].group_id
    facts = {
        (Taken.EVENT_ID, Place.DEAD, "dead", dead_group, dead_event, "dead"),
        (Taken.EVENT_ID, Place.GROUP, "later", retry_group, retried, "retrying"),
        (Taken.EVENT_ID, Place.BUFFER, "dead", None, waiting, None),
    }
    # Two buffers count their ids each on their own, and SQLite gives a deleted row's id
    # again: one number may be several events, each found.
    numbers = (dead_event, retried, waiting)
    assert (
        {n: {f for f in facts if f[4] == n} for n in numbers},
        [f"event ids searched among the newest {search.ARCHIVE_SCAN:,} archived events"],
    ) == (
        {n: _found(search.search(app, str(n))) for n in numbers},
        search.search(app, str(waiting)).notes,
    )


def test_a_group_id_is_found_with_its_job_dead_or_archived(app: Outbox, commit_events: Any) -> None:
    """A retrying group by its job, a dead one in the archive, a discarded one archived."""
    commit_events(app.engine, 1)
    for _ in range(2):
        commit_events(app.engine, 1, EmailEvent)
        drain(app)
    [dead] = groups.find(app, Selection(handlers=("dead",))).groups
    first, second = groups.find(app, Selection(handlers=("later",))).groups
    group_operations.discard(app, Selection(group_ids=(second.group_id,)))
    assert (
        {(Taken.GROUP_ID, Place.GROUP, "later", first.group_id, None, "retrying")},
        {(Taken.GROUP_ID, Place.DEAD, "dead", dead.group_id, None, "dead")},
        {(Taken.GROUP_ID, Place.ARCHIVE, "later", second.group_id, None, "discarded")},
    ) == tuple(_found(search.search(app, str(g.group_id))) for g in (first, dead, second))


def test_an_ingest_key_is_found_where_its_event_is(app: Outbox) -> None:
    """A producer's key leads to the event written under it, in its buffer."""
    [written] = ingest.ingest(app, "dead", [("order-17", {"activity_id": 17})])
    assert {(Taken.INGEST_KEY, Place.BUFFER, "dead", None, written.event_id, None)} == _found(
        search.search(app, "order-17")
    )


def test_an_ordering_key_is_found_held_in_groups_and_where_indexed_in_the_buffer(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Any
) -> None:
    """An ordered handler's key: the dead group that holds it; a buffer without an index on
    the key is not read for events outside a group, and the note says so; a buffer with one
    counts them."""
    engine = make_app(database_url).engine
    _KeyedBase.metadata.drop_all(engine)
    _KeyedBase.metadata.create_all(engine)
    app = make_app(database_url)
    app.handler(ActivityEvent, batch_size=5, retry=ONE_SHOT, ordering_key="kind", name="plain")(
        _fail
    )
    app.handler(KeyedEvent, batch_size=5, ordering_key="account", name="keyed")(_fail)
    commit_events(app.engine, 1, kind="acme")
    drain(app, handlers=["plain"])
    commit_events(app.engine, 2, kind="acme")
    with app.engine.begin() as conn:
        conn.execute(KeyedEvent.__table__.insert(), [{"account": "acme"}, {"account": "acme"}])
    [held] = groups.find(app, Selection(statuses=("held",))).groups
    result = search.search(app, "acme")
    buffered = [f.events for f in result.found if f.place == Place.BUFFER]
    assert (
        {
            (Taken.ORDERING_KEY, Place.DEAD, "plain", held.group_id, None, "held"),
            (Taken.ORDERING_KEY, Place.BUFFER, "keyed", None, None, None),
        },
        [2],
        [
            "test_activity_events has no index on kind: its events not yet in a group were "
            "not searched for the key (plain's groups were)"
        ],
    ) == (_found(result), buffered, result.notes)
    _KeyedBase.metadata.drop_all(engine)


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
@pytest.mark.parametrize(
    ("text", "said"),
    [("  ", "text: expected"), ("x" * 401, "at most 400"), ("a\x00b", "holds a NUL")],
    ids=["blank", "long", "nul"],
)
def test_a_search_of_no_text_or_a_text_no_key_can_be_is_refused(
    app: Outbox, text: str, said: str
) -> None:
    """Nothing to look for, more than a key can be, or a NUL no database text holds: refused,
    naming the text."""
    with pytest.raises(ConfigurationError) as raised:
        search.search(app, text)
    assert said in str(raised.value)


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_found_nowhere_is_an_empty_answer(app: Outbox) -> None:
    """A group id, a number and a word nobody has: nothing found, nothing refused."""
    answers = [search.search(app, t).found for t in ("7", "no-such-key", str(uuid.uuid4()))]
    assert [[], [], []] == answers
