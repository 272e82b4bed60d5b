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


def handler_outcomes(results: Results) -> Rendered:
    """When a deferred group comes back, and good events' latency while poison events are
    isolated by bisection under a circuit breaker."""
    data = results.data
    label = data.get("label")
    lines = [f"**{label}**" if label else "**This revision**", ""]
    lines += [
        "Deferral return time: groups of one event, each deferred once by "
        "`batch.retry(events, after=A)`, an in-process worker with the default settings; from "
        "the deferring call to the call that takes the group back, against the documented "
        "bound A x 1.1 + 0.5 s.",
        "",
    ]
    body = [
        [
            f"{d['after']:g}",
            str(d["groups"]),
            f"{d['min_seconds']:.3f}",
            f"{d['p50_seconds']:.3f}",
            f"{d['p99_seconds']:.3f}",
            f"{d['max_seconds']:.3f}",
            f"{d['bound_seconds']:g}",
            f"{d['within_bound']}/{d['returned']}",
        ]
        for d in data["deferrals"]
    ]
    header = ["after (s)", "groups", "min", "p50", "p99", "max", "bound", "within"]
    lines += table(header, body)
    b = data["bisection"]
    opened = b["breaker_openings"]
    lines += [
        f"Good events during bisection: {b['events']:,} events waiting, {b['poison']} of them "
        f"poison (a whole-call 400 for any call that carries one, raised unmarked), groups of "
        f"{b['batch_size']}, `bisect=True` and `CircuitBreaker(failures="
        f"{b.get('breaker_failures', 5)})`; "
        f"{b['written_during_run']} good events written meanwhile, from commit to delivery:",
        "",
    ]
    lines += table(
        ["p50 (s)", "p99 (s)", "max (s)", "promise (s)", "breaker openings", "poison dead"],
        [
            [
                f"{b['p50_seconds']:.3f}",
                f"{b['p99_seconds']:.3f}",
                f"{b['max_seconds']:.3f}",
                f"{b['promise_seconds']:g}",
                str(len(opened)),
                f"{b['dead']}/{b['poison']}",
            ]
        ],
    )
    return lines, []
