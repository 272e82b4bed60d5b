"""The checker sees each kind of violation: a fault suite that cannot fail proves nothing."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from tests.faults._checker import Observations, analyse, read_deliveries


def _observe(**changes: object) -> Observations:
    """Three committed events, one rolled back, each delivered and archived once."""
    seen: dict[str, object] = {
        "proven": frozenset({1, 2, 3}),
        "rolled_back": frozenset({4}),
        "deliveries": Counter({1: 1, 2: 1, 3: 1}),
        "archived": Counter({1: 1, 2: 1, 3: 1}),
        "archived_dead": frozenset(),
        "buffered": Counter(),
        "left_claimed": 0,
        "left_unclaimed": 0,
        "jobs_left": 0,
    }
    seen.update(changes)
    return Observations(**seen)  # type: ignore[arg-type]


def test_clean_history_has_no_violation() -> None:
    """Every committed event delivered and archived once: nothing to report."""
    assert {} == analyse(_observe()).violations


def test_committed_event_never_delivered_nor_archived_is_lost() -> None:
    """A proven event with no delivery and no archive row counts as lost (and unterminated)."""
    seen = _observe(deliveries=Counter({1: 1, 2: 1}), archived=Counter({1: 1, 2: 1}))

    assert {"lost": 1, "unterminated": 1} == analyse(seen).violations


def test_rolled_back_event_delivered_is_phantom() -> None:
    """A delivery of an event with no proof row is a phantom."""
    seen = _observe(deliveries=Counter({1: 1, 2: 1, 3: 1, 4: 1}))

    assert {"phantom": 1} == analyse(seen).violations


def test_rolled_back_event_with_a_proof_row_is_phantom() -> None:
    """An event its producer rolled back must not be proven committed."""
    seen = _observe(
        proven=frozenset({1, 2, 3, 4}),
        deliveries=Counter({1: 1, 2: 1, 3: 1, 4: 1}),
        archived=Counter({1: 1, 2: 1, 3: 1, 4: 1}),
    )

    assert {"phantom": 1} == analyse(seen).violations


def test_event_archived_twice_is_a_concurrent_commit() -> None:
    """Two archive rows for one event: two completions of its group both committed."""
    seen = _observe(archived=Counter({1: 2, 2: 1, 3: 1}))

    assert {"concurrent_commits": 1} == analyse(seen).violations


def test_redelivery_is_counted_but_not_a_violation() -> None:
    """At least once allows duplicates: counted, never a violation."""
    report = analyse(_observe(deliveries=Counter({1: 3, 2: 1, 3: 1})))

    assert ({}, 1, 2) == (report.violations, report.duplicated, report.redeliveries)


def test_rows_and_jobs_left_behind_are_violations() -> None:
    """After the drain, claimed rows, waiting rows and jobs are all violations."""
    seen = _observe(left_claimed=2, left_unclaimed=1, jobs_left=1)

    assert {"left_claimed": 2, "left_unclaimed": 1, "jobs_left": 1} == analyse(seen).violations


def test_torn_last_line_of_a_delivery_file_is_not_a_delivery(tmp_path: Path) -> None:
    """A worker killed mid-write leaves a torn last line: it does not count."""
    (tmp_path / "handled-1.log").write_text("1 g 1 1\n2 g 1 1\n3 g")

    assert Counter({1: 1, 2: 1}) == read_deliveries(tmp_path)
