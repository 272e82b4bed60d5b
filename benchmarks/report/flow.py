"""Flow control: draining through a rate-limited bulk API, against the theoretical minimum."""

from __future__ import annotations

from benchmarks.report._format import DASH, Rendered, Results, Target, count, table
from benchmarks.report.targets import RATE_LIMITED_RATIO


def drain_rate_limited(results: Results) -> Rendered:
    """Seconds to drain through an API limited to R calls/s, against events / batch / R."""
    data = results.data
    accounts = data.get("accounts") or 0
    limits = (
        f"the handler's `RateLimit` at {data['limit_fraction']:g} of it"
        if not accounts
        else f"the handler's fleet-wide `RateLimit` at {data['limit_fraction']:g} of it and, "
        f"the events belonging to {accounts} accounts grouped by account, a second limit of "
        f"{data['account_calls_per_second']} calls a second per account"
    )
    lines = [
        f"{data['events']:,} events on PostgreSQL, {count(data['batch_size'])} per call, "
        f"`outbox work --processes {data['processes']}` against the marketing example's fake "
        f"bulk API allowing {data['api_calls_per_second']:g} calls in any second (429 and "
        f"Retry-After beyond); {limits}. Timed from starting the command until the buffer is "
        f"empty, process start-up included; the theoretical minimum is "
        f"{data['minimum_seconds']:g} s; ratio = minimum / measured. The most calls in a "
        f"second as they arrived at the API, and as they started at the handler's entry (where "
        f"the limit holds exactly; arrivals add the call's own jitter).",
        "",
    ]
    body = [
        [
            str(n),
            f"{run['seconds']:.2f}",
            f"{run['ratio']:.3f}",
            str(run["calls"]),
            str(run["refused_429"]),
            str(run["most_calls_in_a_second"]),
            str(run.get("most_calls_in_a_second_at_entry", DASH)),
        ]
        for n, run in enumerate(data["runs"], start=1)
    ]
    header = [
        "run", "seconds", "ratio", "calls", "refused (429)", "most calls in a second (API)",
        "most at entry",
    ]  # fmt: skip
    lines += table(header, body)
    if accounts:
        return lines, []
    ratio = data.get("median_ratio")
    target = Target(
        "drain_rate_limited",
        f"drain time: theoretical minimum / measured ≥ {RATE_LIMITED_RATIO} (median of the runs)",
        DASH if ratio is None else f"{ratio:.3f}",
        None if ratio is None else ratio >= RATE_LIMITED_RATIO,
    )
    return lines, [target]
