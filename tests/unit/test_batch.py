"""Batch: partial-failure reports (retry, discard) and their validation."""

from __future__ import annotations

import uuid

import pytest

from outbox import Batch
from tests.models import ActivityEvent


def make_batch(count: int = 4) -> Batch[ActivityEvent]:
    events = [ActivityEvent(id=n, activity_id=n * 10) for n in range(1, count + 1)]
    return Batch(events=events, group_id=uuid.uuid4(), attempt=1, handler="sync")


def test_a_fresh_batch_singles_out_nothing() -> None:
    """Before any report, nothing is retried or discarded."""
    batch = make_batch()
    assert ({}, {}) == (batch.retried_ids, batch.discarded_ids)


def test_retry_records_ids_with_reason() -> None:
    """retry() records each event's id with the reason given."""
    batch = make_batch()
    batch.retry(batch.events[:2], "rate limited")
    assert {1: "rate limited", 2: "rate limited"} == batch.retried_ids


def test_discard_records_ids_with_reason() -> None:
    """discard() records each event's id with the reason given."""
    batch = make_batch()
    batch.discard([batch.events[3]], "invalid address")
    assert {4: "invalid address"} == batch.discarded_ids


def test_separate_reports_keep_their_own_reasons() -> None:
    """Two retry() calls keep the reason each event was given."""
    batch = make_batch()
    batch.retry([batch.events[0]], "timeout")
    batch.retry([batch.events[2]], "rate limited")
    assert {1: "timeout", 3: "rate limited"} == batch.retried_ids


def test_discard_wins_over_retry() -> None:
    """An event both retried and discarded counts as discarded only."""
    batch = make_batch()
    batch.retry(batch.events[:2], "timeout")
    batch.discard([batch.events[1]], "invalid")
    assert ({1: "timeout"}, {2: "invalid"}) == (batch.retried_ids, batch.discarded_ids)


def test_retry_of_event_outside_the_group_raises() -> None:
    """retry() refuses events that are not in this group."""
    batch = make_batch()
    with pytest.raises(ValueError, match=r"\[99\] are not in group"):
        batch.retry([ActivityEvent(id=99, activity_id=0)], "timeout")


def test_discard_of_event_outside_the_group_raises() -> None:
    """discard() refuses events that are not in this group."""
    batch = make_batch()
    with pytest.raises(ValueError, match=str(batch.group_id)):
        batch.discard([ActivityEvent(id=99, activity_id=0)], "invalid")


def test_refused_report_records_nothing() -> None:
    """A report mixing group events and strangers is refused as a whole."""
    batch = make_batch()
    with pytest.raises(ValueError, match="not in group"):
        batch.retry([batch.events[0], ActivityEvent(id=99, activity_id=0)], "timeout")
    assert {} == batch.retried_ids


def test_batch_iterates_and_counts_its_events() -> None:
    """len() and iteration go over the events in order."""
    batch = make_batch(3)
    assert (3, [1, 2, 3]) == (len(batch), [e.id for e in batch])
