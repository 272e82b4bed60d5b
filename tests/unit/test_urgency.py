"""Urgency bands: the built-ins, their order, custom bands and validation."""

from __future__ import annotations

import pytest

from outbox import ConfigurationError, Urgency


@pytest.mark.parametrize(
    ("band", "name", "promise"),
    [
        (Urgency.REALTIME, "REALTIME", 60.0),
        (Urgency.MINUTES, "MINUTES", 300.0),
        (Urgency.HOUR, "HOUR", 3600.0),
        (Urgency.DAY, "DAY", 86400.0),
        (Urgency.WEEK, "WEEK", 604800.0),
    ],
)
def test_builtin_band_promises(band: Urgency, name: str, promise: float) -> None:
    """Each built-in band carries its name and its promise in seconds."""
    assert (name, promise) == (band.name, band.promise)


def test_builtins_are_listed_most_urgent_first() -> None:
    """builtins() lists REALTIME to WEEK."""
    expected = ["REALTIME", "MINUTES", "HOUR", "DAY", "WEEK"]
    assert expected == [band.name for band in Urgency.builtins()]


def test_builtin_priorities_strictly_increase_with_promise() -> None:
    """A more urgent band has a lower priority number, so it is taken first."""
    priorities = [band.priority for band in Urgency.builtins()]
    assert sorted(set(priorities)) == priorities


def test_custom_band_keeps_its_values() -> None:
    """Applications may define a band of their own between the built-ins."""
    nightly = Urgency("NIGHTLY", priority=35, promise=43200.0)
    assert ("NIGHTLY", 35, 43200.0) == (nightly.name, nightly.priority, nightly.promise)


def test_bands_compare_by_value() -> None:
    """Two bands with equal fields are equal (a value object)."""
    assert Urgency("HOUR", priority=20, promise=3600.0) == Urgency.HOUR


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"name": "", "priority": 1, "promise": 1.0}, "name"),
        ({"name": "X", "priority": -1, "promise": 1.0}, "priority"),
        ({"name": "X", "priority": 32768, "promise": 1.0}, "priority"),
        ({"name": "X", "priority": 1, "promise": 0.0}, "promise"),
    ],
)
def test_invalid_band_error_names_the_field(kwargs: dict[str, object], field: str) -> None:
    """An invalid band raises ConfigurationError naming the offending field."""
    with pytest.raises(ConfigurationError, match=rf"Urgency\.{field}\b"):
        Urgency(**kwargs)  # type: ignore[arg-type]


def test_band_is_immutable() -> None:
    """Bands are frozen: a built-in cannot be changed by accident."""
    with pytest.raises(AttributeError):
        Urgency.HOUR.priority = 0  # type: ignore[misc]
