"""``outbox run --once``: options out of range are refused before anything runs, exit 2,
naming the option and its range; the tick's bounds and the tick's name from the clock."""

from __future__ import annotations

import datetime as dt

import pytest
from click.testing import CliRunner

from outbox._engine.distributor import tick_of
from outbox.cli import main


@pytest.mark.parametrize(
    ("option", "value", "allowed"),
    [
        ("--every", "0", "0.001 to 604800 seconds"),
        ("--every", "nan", "0.001 to 604800 seconds"),
        ("--every", "inf", "0.001 to 604800 seconds"),
        ("--budget", "0", "more than 0 and at most 86400 seconds"),
        ("--budget", "-5", "more than 0 and at most 86400 seconds"),
        ("--max-groups", "0", "x>=1"),
    ],
)
def test_an_option_out_of_range_is_a_usage_error_naming_it(
    option: str, value: str, allowed: str
) -> None:
    """Exit 2, ``Invalid value for '--every'`` and what it takes."""
    result = CliRunner().invoke(
        main, ["--database-url", "sqlite://", "run", "--once", option, value]
    )
    assert (2, True, True) == (
        result.exit_code,
        f"Invalid value for '{option}'" in result.output,
        allowed in result.output,
    )


def test_run_without_once_names_the_option() -> None:
    """``outbox run`` alone: exit 2, ``--once`` named."""
    result = CliRunner().invoke(main, ["--database-url", "sqlite://", "run"])
    assert (2, True) == (result.exit_code, "Missing option '--once'" in result.output)


@pytest.mark.parametrize(
    ("now", "every", "expected"),
    [
        (dt.datetime(2026, 11, 29, 10, 0, 59, 999_999, tzinfo=dt.UTC), 60.0, 1_795_946_400_000),
        (dt.datetime(2026, 11, 29, 10, 1, 0, tzinfo=dt.UTC), 60.0, 1_795_946_460_000),
        (dt.datetime(2026, 11, 29, 10, 1, 0, 250_000), 0.5, 1_795_946_460_000),
        (dt.datetime(2026, 11, 29, 10, 1, 0, 750_000), 0.5, 1_795_946_460_500),
    ],
)
def test_a_tick_is_named_by_its_start_in_milliseconds(
    now: dt.datetime, every: float, expected: int
) -> None:
    """``floor(now / every) * every`` in whole milliseconds; a time without a zone is UTC."""
    assert expected == tick_of(now, every)


def test_ticks_of_different_lengths_compare_by_when_they_start() -> None:
    """A minute's tick starts no later than the tick of five seconds within it."""
    now = dt.datetime(2026, 11, 29, 10, 1, 37, tzinfo=dt.UTC)
    assert (True, True) == (tick_of(now, 60.0) <= tick_of(now, 5.0), tick_of(now, 5.0) % 5000 == 0)
