"""Against the peers: pgqueuer and procrastinate draining the same jobs."""

from __future__ import annotations

from typing import Any

from benchmarks.report._format import (
    Rendered,
    Results,
    Target,
    count,
    few_runs,
    spread,
    table,
    target_table,
)
from benchmarks.report.targets import PEERS_JOBS, PGQUEUER_RATIO, PROCRASTINATE_RATIO


def best(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The configuration with the highest median: the one a library is compared by."""
    return max(rows, key=lambda row: row["median"])


def peer_configuration(library: str, row: dict[str, Any]) -> str:
    """One configuration of the peers benchmark, in words."""
    if library == "outbox":
        return (
            f"{row['processes']} process, {row['threads']} threads, "
            f"batch {count(row['batch_size'])}"
        )
    if library == "pgqueuer":
        return f"{row['consumers']} consumers, batch {row['batch_size']}"
    return f"{row['workers']} worker, concurrency {row['concurrency']}"


def judged_peers(results: Results) -> bool:
    """Whether peers results are the judged run: as many jobs as the drain's events."""
    return int(results.data["jobs"]) == PEERS_JOBS


def peers(results: Results) -> Rendered:
    """Every configuration of every library; the ratios of outbox to each peer's best."""
    data = results.data
    versions = data.get("versions", {})
    runs = max(
        len(row["rates"]) for lib in ("outbox", "pgqueuer", "procrastinate") for row in data[lib]
    )
    lines = [
        f"No-op jobs, jobs/s; timed: {data.get('timing', 'draining processes')}. "
        f"pgqueuer {versions.get('pgqueuer', '?')}, procrastinate "
        f"{versions.get('procrastinate', '?')}. Each peer's best configuration is the one "
        "compared.",
        "",
        *few_runs(runs),
    ]
    body = []
    for library in ("outbox", "pgqueuer", "procrastinate"):
        jobs = data["procrastinate_jobs"] if library == "procrastinate" else data["jobs"]
        top = best(data[library])
        for row in data[library]:
            body.append(
                [
                    library,
                    peer_configuration(library, row),
                    count(jobs),
                    str(len(row["rates"])),
                    count(row["median"])
                    + (" (best)" if row is top and library != "outbox" else ""),
                    spread(row["rates"]),
                ]
            )
    lines += table(["library", "configuration", "jobs", "runs", "jobs/s", "spread"], body)
    ours = best(data["outbox"])["median"]
    goals = (("pgqueuer", PGQUEUER_RATIO, 2), ("procrastinate", PROCRASTINATE_RATIO, 1))
    ratios = {library: ours / best(data[library])["median"] for library, _, _ in goals}
    figures = {library: f"{ratios[library]:.{n}f}" for library, _, n in goals}
    if not judged_peers(results):
        shown = "; ".join(
            f"outbox / {library} best {figure}" for library, figure in figures.items()
        )
        lines += [
            f"Shown, not judged (the target is set at {count(PEERS_JOBS)} jobs): {shown}.",
            "",
        ]
        return lines, []
    targets = [
        Target(
            "peers",
            f"outbox / {library} best ≥ {goal:g}",
            figures[library],
            ratios[library] >= goal,
        )
        for library, goal, _ in goals
    ]
    lines += target_table(targets)
    return lines, targets
