"""A batch's result: event ages and lateness, computed from creation times when asked."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest

from outbox.results import SUCCEEDED, BatchResult

FINISHED = dt.datetime(2026, 1, 1, 12, 0, 10, tzinfo=dt.UTC)


def _result(created: tuple[dt.datetime, ...], promise: float = 5.0) -> BatchResult:
    return BatchResult(
        "h", uuid.uuid4(), 1, SUCCEEDED, created_at=created, finished_at=FINISHED, promise=promise
    )


@pytest.mark.parametrize("tzinfo", [dt.UTC, None], ids=["aware", "naive-utc"])
def test_ages_and_lateness_come_from_creation_times(tzinfo: dt.tzinfo | None) -> None:
    """Naive creation times (SQLite) are read as UTC, like the aware ones PostgreSQL returns."""
    created = tuple(
        (FINISHED - dt.timedelta(seconds=age)).replace(tzinfo=tzinfo) for age in (3.0, 8.0, 1.5)
    )
    result = _result(created)
    assert ((3.0, 8.0, 1.5), 3.0) == (result.event_ages, result.lateness)


def test_a_result_without_events_has_no_ages_and_no_lateness() -> None:
    result = BatchResult("h", uuid.uuid4(), 1, SUCCEEDED)
    assert ((), None) == (result.event_ages, result.lateness)
