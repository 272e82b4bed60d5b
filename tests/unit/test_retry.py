"""RetryPolicy: the backoff formula, jitter, caps, validation and exhaustion."""

from __future__ import annotations

import pytest

from outbox import ConfigurationError, RetryPolicy
from outbox._core.checks import MAX_WAIT_SECONDS


@pytest.mark.parametrize(("attempt", "expected"), [(1, 6.0), (2, 21.0), (3, 86.0), (4, 261.0)])
def test_default_base_delay_is_attempt_to_the_fourth_plus_five_seconds(
    attempt: int, expected: float
) -> None:
    """The default wait after failed attempt n is n**4 + 5 seconds."""
    assert expected == RetryPolicy().base(attempt)


def test_delay_with_midpoint_random_equals_base() -> None:
    """A rand() of 0.5 applies no jitter at all."""
    assert 86.0 == RetryPolicy().delay(3, rand=lambda: 0.5)


def test_delay_with_lowest_random_is_base_minus_jitter_fraction() -> None:
    """A rand() of 0 shortens the wait by the jitter fraction (10 % by default)."""
    assert pytest.approx(21.0 * 0.9) == RetryPolicy().delay(2, rand=lambda: 0.0)


def test_delay_with_highest_random_stays_below_base_plus_jitter_fraction() -> None:
    """A rand() just below 1 lengthens the wait by just under the jitter fraction."""
    delay = RetryPolicy().delay(2, rand=lambda: 0.999999)
    assert 21.0 * 1.1 > delay > 21.0 * 1.0999


def test_delay_stays_within_jitter_bounds_for_any_random() -> None:
    """Whatever rand() returns in [0, 1), the wait stays within ±jitter of the base."""
    policy = RetryPolicy(jitter=0.25)
    delays = [policy.delay(1, rand=lambda r=r: r / 100) for r in range(100)]
    assert all(6.0 * 0.75 <= d < 6.0 * 1.25 for d in delays)


def test_zero_jitter_gives_exact_base() -> None:
    """With jitter=0 the wait is the formula, whatever rand() returns."""
    assert 261.0 == RetryPolicy(jitter=0).delay(4, rand=lambda: 0.0)


def test_max_delay_caps_a_single_wait() -> None:
    """max_delay caps the base wait of late attempts."""
    assert 100.0 == RetryPolicy(max_delay=100.0).base(4)


def test_max_delay_leaves_shorter_waits_alone() -> None:
    """max_delay does not lengthen waits already below it."""
    assert 21.0 == RetryPolicy(max_delay=100.0).base(2)


def test_custom_formula_uses_scale_exponent_and_base_delay() -> None:
    """delay(n) = scale * n ** exponent + base_delay."""
    assert 2.0 * 3**2 + 1.0 == RetryPolicy(scale=2.0, exponent=2.0, base_delay=1.0).base(3)


def test_attempt_below_one_is_refused() -> None:
    """Attempts are 1-based; attempt 0 is a programming error."""
    with pytest.raises(ValueError, match="attempt must be >= 1"):
        RetryPolicy().base(0)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"max_attempts": 0}, "max_attempts"),
        ({"exponent": -1.0}, "exponent"),
        ({"scale": -1.0}, "scale"),
        ({"base_delay": -0.5}, "base_delay"),
        ({"jitter": 1.0}, "jitter"),
        ({"jitter": -0.1}, "jitter"),
        ({"max_delay": -1.0}, "max_delay"),
        ({"max_attempts": "3"}, "max_attempts"),
        ({"max_attempts": 2.5}, "max_attempts"),
        ({"max_deferrals": None}, "max_deferrals"),
        ({"max_deferrals": 2.5}, "max_deferrals"),
        ({"max_deferrals": True}, "max_deferrals"),
        ({"scale": "1"}, "scale"),
        ({"jitter": float("nan")}, "jitter"),
    ],
)
def test_invalid_value_error_names_the_field(changes: dict[str, float], field: str) -> None:
    """An invalid RetryPolicy raises ConfigurationError naming the offending field."""
    with pytest.raises(ConfigurationError, match=rf"RetryPolicy\.{field}\b"):
        RetryPolicy(**changes)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "policy",
    [
        RetryPolicy(max_attempts=100),  # attempt 100 of the default curve: 3.2 years
        RetryPolicy(exponent=40.0),
        RetryPolicy(exponent=400.0),  # past what a float holds
        RetryPolicy(exponent=400),
        RetryPolicy(max_attempts=100, jitter=0.5),
    ],
)
def test_no_wait_is_longer_than_a_year_however_steep_the_curve(policy: RetryPolicy) -> None:
    """No database stores a time past the year 9999: a wait stops at a year, jitter included."""
    attempt = policy.max_attempts
    assert [MAX_WAIT_SECONDS] * 3 == [
        policy.base(attempt),
        policy.delay(attempt, lambda: 0.5),
        policy.delay(attempt, lambda: 0.999),
    ]


def test_exhausted_is_false_before_the_last_attempt() -> None:
    """Attempt 7 of 8 leaves one more try."""
    assert False is RetryPolicy().exhausted(7)


def test_exhausted_is_true_at_the_last_attempt() -> None:
    """Attempt 8 of the default 8 is the last one."""
    assert True is RetryPolicy().exhausted(8)


def test_single_attempt_policy_is_exhausted_after_the_first_try() -> None:
    """max_attempts=1 means no retry at all."""
    assert True is RetryPolicy(max_attempts=1).exhausted(1)


def test_policy_is_immutable() -> None:
    """RetryPolicy is a frozen value object."""
    policy = RetryPolicy()
    with pytest.raises(AttributeError):
        policy.max_attempts = 3  # type: ignore[misc]
