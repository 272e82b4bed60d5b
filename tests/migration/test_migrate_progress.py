"""``outbox migrate`` told to stop between two revisions (outbox.ops.progress)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from sqlalchemy import Engine

from outbox.ops.migrate import current_revision, known_revisions, migrate
from outbox.ops.progress import Progress, StoppedError


class StopAfterOne(Progress):
    """Asks to stop once one revision is applied."""

    def __init__(self) -> None:
        self.done = 0

    def advance(self, done: int) -> None:
        self.done += done

    def should_stop(self) -> bool:
        return self.done >= 1


def test_migrate_asked_to_stop_keeps_the_revisions_it_committed(
    empty_url: str, engine_on: Callable[[str], Engine]
) -> None:
    """Asked to stop after its first revision, migrate raises StoppedError saying how many it
    kept: one on PostgreSQL and MariaDB (a transaction per revision); none on SQLite, whose
    run is one transaction. A run after goes on to head."""
    engine = engine_on(empty_url)
    revisions = known_revisions()
    kept = 0 if engine.dialect.name == "sqlite" else 1

    with pytest.raises(StoppedError) as stopped:
        migrate(engine, progress=StopAfterOne())
    at = current_revision(engine)
    migrate(engine)

    assert (
        f"migrated {kept} of {len(revisions)} revisions",
        revisions[kept - 1] if kept else None,
        revisions[-1],
    ) == (stopped.value.summary, at, current_revision(engine))
