"""The flags proof: the employee example of "Using your database as a queue" handled by four
``outbox work`` processes, two of them SIGKILLed and replaced, while a writer keeps changing
employees, some while they are being handled; a handler that fails a share of its calls. Every
flag is cleared, and only by a success of its handler on the state it cleared; several workers
work at once; a failed group waits the retry policy's wait, longer than the poll interval. On
SQLite, PostgreSQL and MariaDB.

The harness is ``benchmarks/flags.py`` (its docstring says how it runs); the test run's small
size is 3,000 employees, a writer for 6 seconds and 2 kills per database. ``OUTBOX_FULL_RUN=1``
adds the full size: 50,000 employees, a writer for 120 seconds, 10 kills (the figures in
benchmarks/RESULTS.md).
"""

from __future__ import annotations

import random

import pytest

from benchmarks.flags import Options, Proof, prove
from benchmarks.flags_app import HandlerConfig

# Seconds SQLite's julianday() arithmetic, which dates a retried group, can be off by.
CLOCK_ERROR = 0.005


def _proved(database_url: str, options: Options) -> Proof:
    proof = prove(database_url, options)
    print(f"\n{proof.database}, seed {options.seed}: {proof.calls}, {proof.retries}")
    # (a), (b): every employee unflagged; none left flagged, dead-lettered or not.
    # (c): every flag cleared, and every unflagged employee's final state, has a success of its
    # handler on that (id, version, name).
    assert {
        "unflagged": options.employees,
        "flagged": 0,
        "unflagged without a success on its state": 0,
        "clears without a success on their state": 0,
    } == {
        "unflagged": proof.employees["unflagged"],
        "flagged": proof.employees["flagged"],
        "unflagged without a success on its state": proof.employees["unflagged_without_success"],
        "clears without a success on their state": proof.clears["without_success"],
    }
    # The faults happened: the kills, failed calls, changes to rows being handled.
    assert options.kills == len(proof.kills)
    assert proof.calls["failed"] > 0
    assert proof.writer["rows_being_handled"] > 0
    return proof


def _retries_waited_the_policy(proof: Proof, config: HandlerConfig) -> None:
    """Each failed call was followed by its group's next attempt no sooner than the retry
    policy's shortest wait, itself longer than the poll interval; none went unanswered."""
    retries = proof.retries
    assert config.shortest_retry_wait() > config.poll_interval
    assert retries["waits"] > 0
    assert retries["shortest_wait"] >= config.shortest_retry_wait() - CLOCK_ERROR
    assert 0 == retries["failures_without_a_later_attempt"]


@pytest.mark.timeout(180)
def test_every_flag_is_cleared_by_a_success_on_its_state_through_kills(
    database_url: str,
) -> None:
    """3,000 flagged employees, changes while they are handled, four workers, two killed: all
    are unflagged, each clear by a success on the state it cleared; calls of several workers
    overlap; retries wait the policy's wait."""
    config = HandlerConfig(fail_fraction=0.3, seed=random.randrange(1 << 30))
    options = Options(
        employees=3_000,
        seconds=6.0,
        changes_per_second=50.0,
        kills=2,
        seed=config.seed,
        timeout=150.0,
        handler=config,
    )
    proof = _proved(database_url, options)
    _retries_waited_the_policy(proof, config)
    assert proof.calls["processes"] > 1
    assert proof.overlap["calls_overlapping_another_process"] > 0


@pytest.mark.timeout(1800)
def test_fifty_thousand_employees_are_each_cleared_by_a_success_on_their_state(
    database_url: str,
) -> None:
    """50,000 flagged employees, a writer for two minutes, ten kills: the same proof."""
    config = HandlerConfig(seed=random.randrange(1 << 30))
    options = Options(seed=config.seed, handler=config)
    proof = _proved(database_url, options)
    _retries_waited_the_policy(proof, config)
