"""The timeliness example: REALTIME alerts keep their promise next to a DAY backlog."""

from __future__ import annotations

from pathlib import Path

import pytest

from examples.timeliness import run


@pytest.fixture(params=["sqlite", "postgresql"])
def figures(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, float | str]:
    """One run of the example on each database."""
    if request.param == "postgresql":
        url: str = request.getfixturevalue("postgres_url")
    else:
        url = f"sqlite:///{tmp_path}/timeliness.sqlite3"
    return run.main(url)


def test_every_alert_and_the_whole_backlog_are_handled(figures: dict[str, float | str]) -> None:
    """All 40 alerts and all 20,000 analytics events reach their handlers."""
    assert (run.ALERTS, run.BACKLOG) == (figures["alerts"], figures["analytics_exported"])


def test_alerts_keep_the_realtime_promise_behind_a_backlog(
    figures: dict[str, float | str],
) -> None:
    """No alert waited anywhere near its one-minute promise while the DAY backlog drained."""
    assert True is (float(figures["alert_max_seconds"]) < 60.0)


def test_status_shows_both_bands(figures: dict[str, float | str]) -> None:
    """The status printed mid-run has a line per handler and per band."""
    status = str(figures["status_mid_run"])
    assert (True, True) == ("page_on_call       REALTIME" in status, "DAY       1 d " in status)
