"""``outbox reindex``: rebuilding the indexes a drained backlog left bloated, on PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import delete, text

from outbox import Outbox
from outbox.exceptions import ConfigurationError
from outbox.ops import reindex
from outbox.ops.progress import Progress, StoppedError
from tests.models import ActivityEvent, EmailEvent

TABLE = "test_activity_events"
# Enough rows that the id indexes pass MIN_BLOATED_BYTES (about 22 bytes a row each).
BACKLOG = 80_000


@pytest.fixture
def app(make_app: Callable[[str], Outbox], postgres_database: str) -> Outbox:
    app = make_app(postgres_database)
    app.handler(ActivityEvent, name="h")(lambda batch: None)
    return app


def index_sizes(app: Outbox) -> dict[str, int]:
    with app.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT c.relname, pg_relation_size(i.indexrelid) FROM pg_index AS i"
                " JOIN pg_class AS c ON c.oid = i.indexrelid"
                " WHERE i.indrelid = CAST(:t AS regclass)"
            ),
            {"t": TABLE},
        )
        return {name: int(size) for name, size in rows}


def drain_and_vacuum(app: Outbox) -> None:
    """What a drained backlog leaves: an empty table, vacuumed, with its indexes still large."""
    with app.engine.begin() as conn:
        conn.execute(delete(ActivityEvent))
    with app.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text(f"VACUUM {TABLE}"))


def test_indexes_bloated_by_a_drained_backlog_are_rebuilt_small(
    app: Outbox, commit_events: Callable[..., Any]
) -> None:
    commit_events(app.engine, BACKLOG)
    drain_and_vacuum(app)
    before = index_sizes(app)

    reports = reindex.reindex(app)

    after = index_sizes(app)
    actions = {r.index: r.action for r in reports}
    assert {
        f"{TABLE}_pkey": "rebuilt",
        f"ix_{TABLE}_unclaimed": "rebuilt",
        f"ix_{TABLE}_group_id": "kept",
    } == actions
    rebuilt = [r.index for r in reports if r.action == "rebuilt"]
    assert all(before[i] > reindex.MIN_BLOATED_BYTES for i in rebuilt)
    assert all(after[i] <= reindex.EMPTY_INDEX_BYTES for i in rebuilt)
    assert {r.index: r.bytes_after for r in reports if r.bytes_after is not None} == {
        i: after[i] for i in rebuilt
    }


def test_indexes_of_a_live_backlog_are_kept(app: Outbox, commit_events: Callable[..., Any]) -> None:
    """Rows still waiting need their index entries: nothing is rebuilt."""
    commit_events(app.engine, BACKLOG)
    before = index_sizes(app)

    reports = reindex.reindex(app)

    assert ({"kept"}, before) == ({r.action for r in reports}, index_sizes(app))


def test_dry_run_says_what_it_would_rebuild_and_changes_nothing(
    app: Outbox, commit_events: Callable[..., Any]
) -> None:
    commit_events(app.engine, BACKLOG)
    drain_and_vacuum(app)
    before = index_sizes(app)

    reports = reindex.reindex(app, dry_run=True)

    assert (2, before) == (
        sum(r.action == "would rebuild" for r in reports),
        index_sizes(app),
    )


def test_an_interrupted_rebuilds_leftover_is_dropped_and_other_invalid_indexes_kept(
    app: Outbox, commit_events: Callable[..., Any]
) -> None:
    """An invalid ``_ccnew`` index (what an interrupted REINDEX CONCURRENTLY leaves) costs
    every write an entry and is never used: it is dropped. An invalid index of another name
    is the application's to deal with."""
    commit_events(app.engine, 10, activity_id=7)
    leftover, own = f"{TABLE}_pkey_ccnew", f"ix_{TABLE}_unique_activity"
    with app.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        for name in (leftover, own):
            # A unique index over duplicates fails to build and stays behind, invalid.
            with pytest.raises(Exception, match="could not create unique index"):
                conn.execute(
                    text(f"CREATE UNIQUE INDEX CONCURRENTLY {name} ON {TABLE} (activity_id)")
                )

    reports = {r.index: r.action for r in reindex.reindex(app)}

    assert ("dropped", "kept", False, True) == (
        reports[leftover],
        reports[own],
        leftover in index_sizes(app),
        own in index_sizes(app),
    )


def test_reindex_needs_postgresql(make_app: Callable[[str], Outbox], sqlite_url: str) -> None:
    app = make_app(sqlite_url)
    app.handler(ActivityEvent, name="h")(lambda batch: None)
    with pytest.raises(ConfigurationError, match="runs on PostgreSQL"):
        reindex.reindex(app)


def test_reindex_told_to_stop_stops_between_two_tables(
    make_app: Callable[[str], Outbox], postgres_database: str
) -> None:
    """A progress that asks to stop after the first buffer table: StoppedError saying one of
    two tables was done."""
    app = make_app(postgres_database)
    app.handler(ActivityEvent, name="activity")(lambda batch: None)
    app.handler(EmailEvent, name="email")(lambda batch: None)

    class StopAfterOne(Progress):
        done = 0

        def advance(self, done: int) -> None:
            self.done += done

        def should_stop(self) -> bool:
            return self.done >= 1

    with pytest.raises(StoppedError) as stopped:
        reindex.reindex(app, progress=StopAfterOne())
    assert "reindexed 1 of 2 buffer tables" == stopped.value.summary
