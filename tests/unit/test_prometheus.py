"""Prometheus instruments without a database: the latency histogram and the optional import."""

from __future__ import annotations

import datetime as dt
import importlib
import sys
import uuid
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from outbox import Outbox, Urgency
from outbox.prometheus import WorkerMetrics
from outbox.results import DEAD, RETRYING, SUCCEEDED, BatchResult
from tests.models import ActivityEvent

LABELS = {"handler": "h", "band": "HOUR"}
FINISHED = dt.datetime(2026, 1, 1, 12, 0, 10, tzinfo=dt.UTC)


def _created(*ages: float) -> dict[str, Any]:
    """Result fields for events created ``ages`` seconds before the batch finished."""
    return {
        "created_at": tuple(FINISHED - dt.timedelta(seconds=age) for age in ages),
        "finished_at": FINISHED,
    }


def _latency_count(registry: CollectorRegistry) -> float | None:
    return registry.get_sample_value("outbox_end_to_end_latency_seconds_count", LABELS)


def test_latency_is_observed_per_event_when_results_carry_ages() -> None:
    """Each event age of a succeeded group is one latency observation."""
    registry = CollectorRegistry()
    result = BatchResult("h", uuid.uuid4(), 1, SUCCEEDED, size=3, **_created(1.0, 2.0, 4.0))
    WorkerMetrics(registry).observe(result, "HOUR")
    actual = (
        _latency_count(registry),
        registry.get_sample_value("outbox_end_to_end_latency_seconds_sum", LABELS),
    )
    assert (3.0, 7.0) == actual


def test_latency_is_not_observed_for_a_group_that_did_not_succeed() -> None:
    """A retrying group completed nothing, so it has no end-to-end latency."""
    registry = CollectorRegistry()
    result = BatchResult("h", uuid.uuid4(), 1, RETRYING, size=2, **_created(1.0, 2.0))
    WorkerMetrics(registry).observe(result, "HOUR")
    assert _latency_count(registry) is None


def test_results_without_ages_are_observed_without_latency() -> None:
    """A group whose events were not loaded has no ages: everything else is still counted."""
    registry = CollectorRegistry()
    result = BatchResult("h", uuid.uuid4(), 9, DEAD, dead=3)
    WorkerMetrics(registry).observe(result, "HOUR")
    actual = (
        registry.get_sample_value("outbox_events_total", {**LABELS, "outcome": "dead"}),
        _latency_count(registry),
    )
    assert (3.0, None) == actual


def test_callback_starts_every_handler_at_zero() -> None:
    """Before any batch, the counters of the application's handlers exist at 0."""
    app = Outbox("sqlite://")
    app.handler(ActivityEvent, urgency=Urgency.HOUR, name="h")(lambda batch: None)
    registry = CollectorRegistry()
    WorkerMetrics(registry).callback(app)
    actual = registry.get_sample_value("outbox_groups_total", {**LABELS, "outcome": "lease_lost"})
    assert 0.0 == actual


def test_missing_prometheus_client_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without prometheus-client, importing outbox.prometheus says which extra to install."""
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    monkeypatch.delitem(sys.modules, "outbox.prometheus")
    with pytest.raises(ImportError) as raised:
        importlib.import_module("outbox.prometheus")
    assert "pip install 'sqlalchemy-outbox[metrics]'" in str(raised.value)
