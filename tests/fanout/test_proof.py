"""The fan-out's proof through the real ``outbox work``: one buffer fanned out to four consumers,
a healthy one and three in trouble (paused, failing half its calls, rate-limited), its worker
processes SIGKILLed at random while the application writes: each consumer gets every event,
the healthy one gets them all while the paused one is still paused, and every buffer is empty
at the end; on SQLite, PostgreSQL and MariaDB.

The harness is ``benchmarks/fanout.py`` (its docstring says how it runs); the test run's small
size is 3,000 events and two kills per database, with short leases and a worker found silent
after two seconds. ``OUTBOX_FULL_RUN=1`` adds the full size, the benchmark's: 200,000 events
written at 1,000 a second, the paused consumer held a minute at least, ten kills, a 20 s lease
(the figures, and the healthy consumer's oldest age against its promise, are in
benchmarks/RESULTS.md: timings live there, not here).
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from benchmarks.fanout import Options, Proof, prove
from benchmarks.fanout_app import CONSUMERS

SMALL = Options(
    events=3_000,
    rate=0.0,  # as fast as the writer can: the paused consumer waits for the healthy one
    pause=2.0,
    resume_when_healthy_done=True,
    batch_size=100,
    consumer_batch_size=100,
    retry_seconds=0.1,
    limited_calls=10.0,  # 1,000 events a second, slower than the writer
    kills=2,
    lease=2.0,
    poll_interval=0.2,
    rescue_interval=0.5,
    worker_stale_after=2.0,
    sample_every=0.2,
    timeout=120.0,
)


def _proved(database_url: str, options: Options) -> Proof:
    proof = prove(database_url, options)
    print(
        f"\n{proof.database}: {proof.seconds} s, {len(proof.kills)} kills, "
        + "; ".join(
            f"{name} {found['handed']} handed, {found['duplicates']} again, "
            f"{found['failed_calls']} failed calls"
            for name, found in proof.consumers.items()
        )
    )
    nothing = {name: 0 for name in CONSUMERS}
    assert {
        "lost": nothing,
        "numbers never written": nothing,
        "rows left": {"source": 0, **nothing},
        "dead letters": 0,
        "kills": options.kills,
        "the command's exit": 0,
    } == {
        "lost": proof.lost,
        "numbers never written": {n: c["unknown"] for n, c in proof.consumers.items()},
        "rows left": proof.left,
        "dead letters": proof.dead_letters,
        "kills": len(proof.kills),
        "the command's exit": proof.work_exit,
    }
    # A paused consumer holds the others back in nothing: the healthy one had every event
    # while the paused one was still paused, and was handed none (the run resumes it only
    # then: were the healthy one held back, the run would time out).
    assert proof.healthy_done_before_resume, proof.pause
    assert 0 == proof.consumers["paused"]["calls_before_resume"]
    # The failing consumer did fail, and went on.
    assert proof.consumers["failing"]["failed_calls"] > 0
    return proof


@pytest.mark.timeout(180)
def test_each_consumer_gets_every_event_while_workers_are_killed(database_url: str) -> None:
    """3,000 events, four consumers (one paused, one failing half its calls, one rate-limited),
    two workers killed: none lost by any consumer, every buffer empty."""
    _proved(database_url, replace(SMALL, seed=random.randrange(1 << 30)))


@pytest.mark.timeout(3600)
def test_two_hundred_thousand_events_reach_every_consumer(
    database_url: str,
) -> None:
    """The benchmark's size: 200,000 events at 1,000 a second, the paused consumer held a
    minute and until the healthy one has every event, ten kills."""
    options = Options(
        events=200_000, pause=60.0, resume_when_healthy_done=True, seed=random.randrange(1 << 30)
    )
    _proved(database_url, options)
