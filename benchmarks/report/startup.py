"""Start-up of ``outbox work``: launch to first claim, the floors, the phases, the imports."""

from __future__ import annotations

from typing import Any

from benchmarks.report._format import DASH, TIMES, Rendered, Results, table


def _ms(figure: dict[str, Any]) -> str:
    return f"{figure['median_ms']:,.0f} ({figure['min_ms']:,.0f}{DASH}{figure['max_ms']:,.0f})"


def _label(variant: dict[str, Any]) -> str:
    processes = variant["processes"]
    flag = f" --processes {processes}" if processes > 1 else ""
    return f"{variant['revision']}: `outbox work --burst{flag}`"


def _phase(figures: dict[str, float], phase: str) -> str:
    """A phase's milliseconds; a dash for a phase the variant has not (no fork)."""
    return f"{figures[phase]:,.0f}" if phase in figures else DASH


def startup(results: Results) -> Rendered:
    """Launch to first claim per revision and process count, beside the floors; the phases of
    the probe runs; what the imports cost."""
    data = results.data
    variants = data["variants"]
    lines = [
        f"{data['repeat']} repeats, interleaved; {data['events']:,} events waiting. Milliseconds, "
        f"median (min{DASH}max); CPU: seconds of the command's processes by its first claim "
        "(the floors: to their exit).",
        "",
    ]
    rows = [
        [f"`{name}`", _ms(floor), "", f"{floor['cpu_s']:.2f}", DASH]
        for name, floor in data["floors"].items()
    ]
    by_key = {(v["revision"], v["processes"]): v for v in variants}
    for variant in variants:
        base = next(
            (
                other
                for (revision, processes), other in by_key.items()
                if revision != "head" and processes == variant["processes"]
            ),
            None,
        )
        ratio = DASH
        if base is not None and variant["revision"] == "head":
            head_ms = variant["first_claim"]["median_ms"]
            ratio = f"{head_ms / base['first_claim']['median_ms']:.2f}{TIMES}"
        rows.append(
            [
                _label(variant),
                _ms(variant["first_claim"]),
                _ms(variant["exit"]),
                f"{variant['first_claim_cpu_s']:.2f}",
                ratio,
            ]
        )
    lines += table(
        ["command", "launch to first claim (floors: to exit)", "to exit", "CPU s", "over base"],
        rows,
    )
    # In the order of the variant with the most phases (one with --processes: its fork).
    phases = list(max((v["phases_ms"] for v in variants), key=len))
    lines += [
        "Where the time goes (the probe's runs, medians in ms; the probe's marks cost a little):",
        "",
    ]
    lines += table(
        ["phase", *(_label(v) for v in variants)],
        [[phase, *(_phase(v["phases_ms"], phase) for v in variants)] for phase in phases]
        + [
            [
                "statements before the first claim",
                *(f"{v['statements_before_first_claim']:g}" for v in variants),
            ]
        ],
    )
    cpu_phases = list(variants[0].get("phases_cpu_ms", {}))
    if cpu_phases:
        lines += ["CPU of the phases before the worker (the probe's runs, medians in ms):", ""]
        lines += table(
            ["phase", *(_label(v) for v in variants)],
            [
                [phase, *(_phase(v["phases_cpu_ms"], phase) for v in variants)]
                for phase in cpu_phases
            ],
        )
    imports = data.get("importtime", {})
    if imports:
        lines += [
            "Imports of `outbox work` by package (`-X importtime`, self ms, least of 3 runs):",
            "",
        ]
        revisions = list(imports)
        width = max(len(imports[r]) for r in revisions)
        names = {v["revision"] for v in variants} - {"head"}
        lines += table(
            [
                f"{next(iter(names)) if r == 'base' and names else r}: package, ms"
                for r in revisions
            ],
            [
                [
                    f"`{imports[r][n]['package']}` {imports[r][n]['self_ms']:g}"
                    if n < len(imports[r])
                    else ""
                    for r in revisions
                ]
                for n in range(width)
            ],
        )
    return lines, []
