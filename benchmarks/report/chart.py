"""The throughput chart: drain rate against batch size, with the peers' best as reference lines
(matplotlib)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.report._format import DASH, Results, count, median
from benchmarks.report.drain import archived, tuned
from benchmarks.report.peers import best, judged_peers, peer_configuration


def drain_series(results: Results) -> dict[tuple[str, int], list[tuple[int, list[float]]]]:
    """(variant, processes) → [(batch size, rates of the runs)], sorted by batch size."""
    data = results.data
    series: dict[tuple[str, int], list[tuple[int, list[float]]]] = {}
    for row in data["rows"]:
        batch = int(row.get("batch_size", data.get("batch_size", 0)))
        for variant in ("raw", "outbox"):
            series.setdefault((variant, row["processes"]), []).append(
                (batch, [float(r) for r in row[f"{variant}_rates"]])
            )
    return {key: sorted(points) for key, points in series.items()}


# The chart. One colour per process count, one line style per variant: the legend is
# read as (variant, processes). The peers' colours are kept apart from the processes'.
COLOURS = {1: "tab:blue", 2: "tab:orange", 3: "tab:cyan", 4: "tab:olive"}


PEER_LINES = {
    "pgqueuer": ("tab:green", "-."),
    "procrastinate": ("tab:red", "-."),
    "outbox": ("tab:purple", ":"),
}


def plot_drain(axes: Any, results: Results) -> tuple[set[int], int]:
    """One line per (variant, processes) against batch size; the batch sizes and most runs."""
    sizes: set[int] = set()
    runs = 0
    ordered = sorted(drain_series(results).items(), key=lambda i: (i[0][0] != "outbox", i[0][1]))
    for (variant, processes), points in ordered:
        xs = [batch for batch, _ in points]
        medians = [median(rates) for _, rates in points]
        rates = [r for _, r in points]
        sizes.update(xs)
        runs = max([runs, *(len(r) for r in rates)])
        colour = COLOURS.get(processes, "tab:gray")
        name = "outbox" if variant == "outbox" else "raw loop (ceiling)"
        axes.errorbar(
            xs,
            medians,
            yerr=[
                [m - min(r) for m, r in zip(medians, rates, strict=True)],
                [max(r) - m for m, r in zip(medians, rates, strict=True)],
            ],
            label=f"{name}, {processes} process{'es' * (processes > 1)}",
            color=colour,
            linestyle="-" if variant == "outbox" else "--",
            marker="o" if variant == "outbox" else "s",
            markersize=6,
            linewidth=2,
            capsize=4,
        )
        # The figure at each point: the chart is read for its numbers. One process's to the
        # left of the point and more processes' to the right, since their rates are often
        # close; on a light box, as lines pass behind them.
        left = processes == 1
        for x, y in zip(xs, medians, strict=True):
            axes.annotate(
                f"{y / 1000:.1f}k",
                (x, y),
                textcoords="offset points",
                xytext=(-8 if left else 8, 0),
                ha="right" if left else "left",
                va="center",
                fontsize=8,
                color=colour,
                bbox={
                    "boxstyle": "round,pad=0.15",
                    "facecolor": "white",
                    "edgecolor": "none",
                    "alpha": 0.8,
                },
            )
    return sizes, runs


def plot_peers(axes: Any, results: Results) -> None:
    """Each peer's best rate, and outbox's in the same run, as horizontal reference lines."""
    data = results.data
    lines = [
        (library, jobs, best(data[library]))
        for library, jobs in (
            ("pgqueuer", data["jobs"]),
            ("procrastinate", data["procrastinate_jobs"]),
            ("outbox", data["jobs"]),
        )
    ]
    rates = sorted(top["median"] for _, _, top in lines)
    for library, jobs, top in lines:
        colour, style = PEER_LINES[library]
        what = "best" if library != "outbox" else "in the peers run"
        axes.axhline(
            top["median"],
            color=colour,
            linestyle=style,
            linewidth=1.5,
            label=f"{library} {what}: {count(top['median'])} jobs/s "
            f"({peer_configuration(library, top)}; {count(jobs)} jobs)",
        )
        # Named on the line too, at the right edge, which is kept clear of the drain's points:
        # above it, or below it when the next line up is close enough for the names to meet.
        above = [r for r in rates if r > top["median"]]
        below = bool(above) and above[0] < 2 * top["median"]
        axes.annotate(
            f"{library} {what}: {count(top['median'])}/s",
            (0.99, top["median"]),
            xycoords=("axes fraction", "data"),
            textcoords="offset points",
            xytext=(0, -3 if below else 3),
            ha="right",
            va="top" if below else "bottom",
            fontsize=8,
            color=colour,
        )


def style_axes(axes: Any, sizes: set[int], room_right: bool) -> None:
    """Log scales with plain numbers; ticks at the measured batch sizes only."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    axes.set_xscale("log")
    axes.set_yscale("log")
    if sizes:
        ordered = sorted(sizes)
        # Room on the right for the reference lines' names.
        axes.set_xlim(ordered[0] / 1.6, ordered[-1] * (5 if room_right else 1.6))
        axes.xaxis.set_major_locator(FixedLocator(ordered))
    axes.xaxis.set_minor_formatter(NullFormatter())
    axes.yaxis.set_minor_formatter(NullFormatter())
    plain = FuncFormatter(lambda v, _: f"{v:,.0f}")
    axes.xaxis.set_major_formatter(plain)
    axes.yaxis.set_major_formatter(plain)
    axes.set_xlabel("batch size (events per claim)")
    axes.grid(True, which="major", alpha=0.3)


def chart(grouped: dict[str, list[Results]], path: Path, link: str) -> tuple[bool, str]:
    """Draw the throughput chart into ``path``; whether it was drawn, and what RESULTS.md says.

    The plain drain and the peers share one panel; drains with ``--archive``, if any, get a
    panel of their own (the peers do not archive).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display on a server
        import matplotlib.pyplot as plt
    except ImportError:
        return False, (
            "The chart was skipped by the last run of the report (matplotlib is not installed; "
            "run it with `.bench-venv/bin/python`): the image may be missing or stale."
        )
    drains = [r for r in grouped.get("drain_throughput", []) if not tuned(r)]
    peer_results = [r for r in grouped.get("peers", []) if judged_peers(r)]
    if not drains and not peer_results:
        return False, "No drain or peers results: the chart was skipped."
    panels = [("no archive", [r for r in drains if not archived(r)])]
    archiving = [r for r in drains if archived(r)]
    if archiving:
        panels.append(("archiving every row", archiving))
    # Panels one above the other, so that the image stays readable at a page's width.
    figure, grid = plt.subplots(
        len(panels), 1, figsize=(10, 6.5 * len(panels)), sharex=False, sharey=True, squeeze=False
    )
    runs, events = 0, set()
    for n, (axes, (caption, files)) in enumerate(zip(grid[:, 0], panels, strict=True)):
        sizes: set[int] = set()
        for results in files:
            found, most = plot_drain(axes, results)
            sizes |= found
            runs = max(runs, most)
            events.add(int(results.data["events"]))
        for results in peer_results if n == 0 else []:
            plot_peers(axes, results)
        # Each panel spans its own batch sizes, with room for the peers' names where they are.
        style_axes(axes, sizes, room_right=bool(peer_results))
        axes.set_ylabel("events/s (jobs/s for the peers), log scale")
        if len(panels) > 1:
            axes.set_title(caption, fontsize=10)
        # matplotlib lists plain lines (the peers) before error bars (the drains); the drains
        # are the subject, so they come first.
        handles, labels = axes.get_legend_handles_labels()
        order = sorted(range(len(labels)), key=lambda i: "jobs/s" in labels[i])
        axes.legend(
            [handles[i] for i in order],
            [labels[i] for i in order],
            loc="upper center",
            bbox_to_anchor=(0.5, -0.11),
            ncol=2,
            fontsize=8.5,
            frameon=False,
        )
    low, high = grid[0][0].get_ylim()
    grid[0][0].set_ylim(low / 1.5, high * 1.5)
    counted = ", ".join(f"{e:,}" for e in sorted(events)) or DASH
    figure.suptitle(
        f"Drain throughput against batch size: {counted} events, "
        + (f"median of {runs} runs (bars: min{DASH}max)" if runs > 1 else "1 run")
        + ", process start-up included",
        fontsize=11,
    )
    figure.tight_layout()
    figure.savefig(path, dpi=130)
    plt.close(figure)
    return True, (
        f"The chart (`{link}/{path.name}`) is drawn from the drain throughput and peers results."
    )
