"""How a duration reads: one function for the command's text, the pages and the sentences they
share (alerts, pauses, silent holders)."""

from __future__ import annotations

import copy

import pytest

from outbox._core.durations import Timed, duration


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, "—"),
        (float("nan"), "—"),
        (0, "0 s"),
        (0.04, "0 s"),
        (0.4, "0.4 s"),
        (2.0, "2 s"),
        (4.26, "4.3 s"),
        (9.96, "10 s"),
        (59, "59 s"),
        (59.9, "59 s"),
        (60, "1 min"),
        (61, "1 min 1 s"),
        (183.4, "3 min 3 s"),
        (3599, "59 min 59 s"),
        (3600, "1 h"),
        (3659, "1 h"),
        (7559, "2 h 5 min"),
        (86_400, "1 d"),
        (86_400 + 7200 + 59, "1 d 2 h"),
        (86_400 + 59 * 60, "1 d"),
        (21 * 86_400 + 3600, "21 d 1 h"),
        (366 * 86_400, "366 d"),
        (-0.4, "-0.4 s"),
        (-183.4, "-3 min 3 s"),
        (-0.01, "0 s"),
        (float("inf"), "∞"),
    ],
)
def test_a_duration_reads_to_its_two_largest_units(seconds: float | None, text: str) -> None:
    """Under 10 s to a tenth, then whole units, the largest first, at most two."""
    assert text == duration(seconds)


def test_a_timed_sentence_reads_as_its_text_and_keeps_its_seconds() -> None:
    """What a page needs for the hover survives joining and copying."""
    sentence = "handler " + Timed("oldest event is ", 183.4, " old") + ": late"
    assert (
        "handler oldest event is 3 min 3 s old: late",
        ("handler ", "oldest event is ", 183.4, " old", ": late"),
        sentence.parts,
    ) == (
        sentence,
        sentence.parts,
        copy.deepcopy([sentence])[0].parts,
    )
