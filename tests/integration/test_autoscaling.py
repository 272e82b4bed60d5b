"""An autoscaler following desired workers through a load step and a rate-limited backfill,
on the rate of a slot a real drain measured: it keeps every promise, and spends fewer
worker-seconds than one following the row count at its best target (the full version, with
more scenarios: ``python -m benchmarks.autoscaling``)."""

from __future__ import annotations

from benchmarks.autoscaling import (
    Fleet,
    best_rows_target,
    desired_policy,
    measure_rate,
    rows_policy,
    scenario_flows,
    simulate,
)

LATENCY_SECONDS = 0.05
BATCH = 100
SECONDS = 7200
REFERENCE_RATE = 440.0
"""The rate of a slot the scenario's numbers are written for; they are scaled to the measured
one, so that the scenario asks the same of any machine."""


def test_desired_workers_keep_every_promise_for_fewer_worker_seconds_than_the_row_count(
    postgres_database: str,
) -> None:
    """REALTIME arrivals step from 200 to 3,000 a second for 20 minutes (at 440 a slot) while
    a rate-limited HOUR handler gets a backfill of 600,000: following desired workers keeps
    both promises and costs fewer worker-seconds than following the row count at the largest
    target (of a doubling series) that keeps the promises of the step alone and of the step
    with the backfill."""
    rate = measure_rate(postgres_database, LATENCY_SECONDS, BATCH, 1000)
    scale = rate / REFERENCE_RATE
    shape = {
        "base_rate": 200 * scale,
        "step_rate": 3000 * scale,
        "step_at": 600,
        "step_seconds": 1200,
        "backfill_at": 300,
        "limit_calls": max(round(5 * scale), 1),
        "batch_size": BATCH,
    }
    step = scenario_flows((rate, rate), backfill=0, **shape)
    mixed = scenario_flows((rate, rate), backfill=round(600_000 * scale), **shape)
    fleet = Fleet()
    target = best_rows_target([step, mixed], fleet, SECONDS, start=max(round(100 * scale), 1))
    desired = simulate(mixed, desired_policy(fleet), fleet, SECONDS, "desired workers")
    rows = simulate(mixed, rows_policy(target), fleet, SECONDS, "row count")
    assert (True, True, True) == (
        desired.kept,
        rows.kept,
        desired.worker_seconds < rows.worker_seconds,
    ), (desired, rows)
