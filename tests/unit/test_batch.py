"""Batch: partial-failure reports (retry, discard) and their validation."""

from __future__ import annotations

import datetime as dt
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


@pytest.mark.parametrize("first", ["retry", "discard"])
def test_one_event_retried_and_discarded_is_refused_where_it_is_said(first: str) -> None:
    """Discard then retry (or retry then discard) of one event is refused at the second call,
    naming it: neither outcome is guessed (before, the discard silently won)."""
    batch = make_batch()
    if first == "retry":
        batch.retry(batch.events[:2], "timeout")
        with pytest.raises(ValueError, match=r"batch.discard: events \[2\] were already retried"):
            batch.discard([batch.events[1]], "invalid")
    else:
        batch.discard([batch.events[1]], "invalid")
        with pytest.raises(ValueError, match=r"batch.retry: events \[2\] were already discarded"):
            batch.retry(batch.events[:2], "timeout")
    assert len(batch.retried_ids) + len(batch.discarded_ids) == (2 if first == "retry" else 1)


class _Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no text")


@pytest.mark.parametrize("method", ["retry", "discard"])
@pytest.mark.parametrize("reason", [{"code": 422}, None, 422, b"bytes", _Unprintable()])
def test_a_reason_that_is_not_text_is_refused_where_it_is_passed(
    method: str, reason: object
) -> None:
    """A dict (or any non-str) reason raises TypeError in the handler's own call, naming the
    argument; before, it was accepted and crashed outbox's bookkeeping after the handler."""
    batch = make_batch()
    with pytest.raises(TypeError, match=rf"batch.{method}: reason must be a str, got "):
        getattr(batch, method)(batch.events[:1], reason)
    assert (batch.retried_ids, batch.discarded_ids) == ({}, {})


@pytest.mark.parametrize("method", ["retry", "discard"])
@pytest.mark.parametrize("events", ["abc", b"ab", {1: 2}, 7, None, [1, 2]])
def test_events_that_are_not_the_batchs_events_are_refused(method: str, events: object) -> None:
    batch = make_batch()
    with pytest.raises(TypeError, match=rf"batch.{method}: events must be"):
        getattr(batch, method)(events, "why")


@pytest.mark.parametrize(
    ("after", "error"),
    [
        ({"s": 1}, TypeError),
        (True, TypeError),
        ([1], TypeError),
        (float("nan"), ValueError),
        (float("inf"), ValueError),
        (10**9, ValueError),
        (dt.datetime(2030, 1, 1), ValueError),  # naive
    ],
)
def test_a_bad_after_is_refused_where_it_is_passed(after: object, error: type[Exception]) -> None:
    batch = make_batch()
    with pytest.raises(error, match=r"batch\.retry: after"):
        batch.retry(batch.events[:1], "later", after=after)  # type: ignore[arg-type]
    assert batch.retried_ids == {}


@pytest.mark.parametrize(
    ("after", "seconds"),
    [
        (0, 0.0),
        (-5, 0.0),
        ("0", 0.0),
        ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0),  # an HTTP date long past
        ("soon", 30.0),  # unreadable: the default
        ("99999999999", 30.0),  # more than a year, in a header: unreadable
        (dt.timedelta(seconds=7), 7.0),
        (12.5, 12.5),
    ],
)
def test_after_reads_every_form_and_unreadable_text_waits_the_default(
    after: object, seconds: float
) -> None:
    """Zero, negative or past waits ask for nothing (the worker's floor, a second, applies:
    tests/integration/test_flow_control.py); unreadable header text waits the default (30 s)."""
    batch = make_batch()
    batch.retry(batch.events[:1], "later", after=after)  # type: ignore[arg-type]
    assert batch.deferred_ids == {1: pytest.approx(seconds)}


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
