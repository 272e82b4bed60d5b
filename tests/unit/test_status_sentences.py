"""The sentences ``outbox status``, ``outbox check`` and the console share: their ages read as a
person reads them, and each keeps its seconds for a page's hover."""

from __future__ import annotations

from outbox._services import distribution_watch
from outbox.ops.metrics import SilentHolding, pause_text


def test_a_silent_holder_reads_its_heartbeat_and_rescue_in_readable_units() -> None:
    """It said ``stopped 9 s ago: rescued in 3725 s``."""
    holding = SilentHolding("batch", "g1", "w:1:a", 9.4, 3725.0)
    assert (
        "group g1 held by w:1:a, whose heartbeat stopped 9.4 s ago: rescued in 1 h 2 min",
        ("group g1 held by w:1:a, whose heartbeat stopped ", 9.4, " ago: rescued ", "in ", 3725.0),
    ) == (holding.text(), holding.text().parts)


def test_a_pause_reads_how_long_it_lasts_in_readable_units() -> None:
    """It said ``for 7200 s more``; a pause without an end and a rescue due now hold no
    duration."""
    assert (
        "paused by an operator for 2 h more: provider maintenance",
        "paused by its circuit breaker until resumed",
        "a claim job held by w:1:a, whose heartbeat stopped 1 min ago: rescued now",
    ) == (
        pause_text("operator", 7200.0, "provider maintenance\nsecond line"),
        pause_text("breaker", None, None),
        SilentHolding("claim", None, "w:1:a", 60.0, 0.0).text(),
    )


def test_the_undistributed_alert_reads_how_long_events_waited() -> None:
    """It said ``waited 200 s``."""
    assert distribution_watch.alert_text(200.0).startswith(
        "oldest unclaimed event has waited 3 min 20 s with no claim job: nothing distributes"
    )
