"""Start-up of ``outbox work``: from launching the process to its first claim, apart from the
steady state, with the floors beside it in the same run.

``--events`` events wait in the bench app's buffer (loaded with COPY, nothing distributed), then
``outbox --app benchmarks.bench_app:app --database-url URL work --burst --no-listen`` (and with
``--processes 2``) is launched; the figure is the time from launching it to its first claim,
and the CPU seconds its processes had spent by then. The first claim is the command's own
``outbox.group.claimed`` line (debug level, JSON on stderr), timestamped as it arrives; the CPU
is read from ``/proc`` at that moment, for the process and its forked workers. Each run then
drains the rest (its exit is kept too) and the buffer is loaded again.

Beside it, in every repeat: ``python -c pass`` and ``python -c "import sqlalchemy"`` (the
floors: an interpreter, and the library every application of outbox imports), timed to their
exit. And a breakdown: the same command run through ``benchmarks/_startup_probe.py``, which
marks the interpreter's start, ``import outbox``, the command's import, the application's
import, each fork and every SQL statement: the phases below are the medians of its runs
(the probe's own marks cost a little; the headline figures come from the plain command).
``python -X importtime`` of one probe run lists the packages whose imports cost most.

``--base REV``: the same runs with outbox at revision REV as well (a temporary git worktree
first on ``PYTHONPATH``, as ``compare_revisions`` does), interleaved run by run, so that a
change is measured before and after on the same machine at the same time.

    python -m benchmarks.startup --repeat 11 [--base REV]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._common import (
    command_line,
    drop_database,
    libpq_url,
    machine,
    scratch_database,
    write,
)
from benchmarks.drain_throughput import APP, ROOT, load, prepare, remaining

PROBE = Path(__file__).with_name("_startup_probe.py")
DATABASE = "startup_bench"
CLAIMED = "outbox.group.claimed"
STARTED = "outbox.worker.started"
FLOORS = {"python -c pass": "pass", "python -c 'import sqlalchemy'": "import sqlalchemy"}
TOP_IMPORTS = 20


def tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` and its children, read from ``/proc``."""
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(entry.name) == pid or int(fields[1]) == pid:
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def floor(python: str, code: str) -> dict[str, float]:
    """Seconds and CPU seconds of ``python -c code``, launch to exit."""
    cpu = children_cpu()
    started = time.monotonic()
    subprocess.run([python, "-c", code], check=True)
    return {"seconds": time.monotonic() - started, "cpu": children_cpu() - cpu}


def work_command(url: str, processes: int) -> list[str]:
    """The arguments of ``outbox work`` after the program's name."""
    command = ["--app", APP, "--database-url", url, "--log-level", "debug", "--log-format"]
    command += ["json", "work", "--burst", "--no-listen"]
    return command + (["--processes", str(processes)] if processes > 1 else [])


def launch(command: list[str], tree: Path, *, probe_marks: bool = False) -> dict[str, Any]:
    """Run one ``outbox work --burst`` to its end; when its first claim, and its other marks."""
    env = {**os.environ, "PYTHONPATH": str(tree), "BENCH_BATCH_SIZE": "1000"}
    started = time.monotonic()
    process = subprocess.Popen(
        command, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    assert process.stderr is not None
    run: dict[str, Any] = {"marks": [], "statements": []}
    for raw in process.stderr:
        now = time.monotonic()
        try:
            line = json.loads(raw)
        except ValueError:
            continue
        if "probe" in line:
            mark = {"what": line["probe"], "at": line["t"] - started, "cpu": line["cpu"]}
            if line["probe"] == "statement":
                run["statements"].append({**mark, "sql": line["sql"]})
            elif probe_marks:
                run["marks"].append(mark)
        elif line.get("event") == STARTED and "started" not in run:
            run["started"] = now - started
        elif line.get("event") == CLAIMED and "first_claim" not in run:
            run["first_claim"] = now - started
            run["first_claim_cpu"] = tree_cpu(process.pid)
    if process.wait() != 0 or "first_claim" not in run:
        raise RuntimeError(f"{' '.join(command[:3])} failed or claimed nothing")
    run["exit"] = time.monotonic() - started
    return run


def phases(run: dict[str, Any], clock: str = "at") -> dict[str, float]:
    """Seconds of each phase of one probe run (``clock="cpu"``: CPU seconds of the process
    that ran it): launch to the interpreter's first line, the imports, the pre-flight, the
    forks, and the first round of work (wall-clock only: the worker's marks are log lines)."""
    marks: dict[str, float] = {}
    for mark in run["marks"]:
        marks.setdefault(mark["what"], mark[clock])
    found = {
        "interpreter": marks["interpreter"],
        "import outbox": marks["import outbox"] - marks["interpreter"],
        "import outbox.cli": marks["import outbox.cli"] - marks["import outbox"],
        "options, and the command's module": marks["app import start"] - marks["import outbox.cli"],
        "import the application": marks["app imported"] - marks["app import start"],
    }
    if clock == "cpu":
        return found
    checks_end = marks.get("forked", run["started"])
    found["connect and pre-flight checks"] = checks_end - marks["app imported"]
    if "forked" in marks:
        found["after the fork, to the worker's start"] = run["started"] - marks["forked"]
    found["worker start to first claim"] = run["first_claim"] - run["started"]
    return found


def importtime(python: str, tree: Path, url: str, runs: int = 3) -> list[dict[str, Any]]:
    """The packages whose imports cost most in a probe run of ``outbox work`` (self time,
    summed by top-level package, outbox's own by subpackage; each package's least of ``runs``
    runs, as a busy machine only ever adds to it)."""
    env = {**os.environ, "PYTHONPATH": str(tree), "BENCH_BATCH_SIZE": "1000"}
    least: dict[str, int] = {}
    for _ in range(runs):
        done = subprocess.run(
            [python, "-X", "importtime", str(PROBE), *work_command(url, 1)],
            cwd=tree,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        by_package: collections.Counter[str] = collections.Counter()
        for line in done.stderr.splitlines():
            if not line.startswith("import time:") or "self [us]" in line:
                continue
            own, _, name = line.split(":", 1)[1].split("|")
            parts = name.strip().split(".")
            by_package[".".join(parts[:2] if parts[0] == "outbox" else parts[:1])] += int(own)
        for package, micros in by_package.items():
            least[package] = min(micros, least.get(package, micros))
    ranked = sorted(least.items(), key=lambda item: -item[1])[:TOP_IMPORTS]
    return [{"package": package, "self_ms": round(micros / 1000, 1)} for package, micros in ranked]


def ms(values: list[float]) -> dict[str, Any]:
    """Median and spread of seconds, in milliseconds."""
    return {
        "median_ms": round(1000 * statistics.median(values), 1),
        "min_ms": round(1000 * min(values), 1),
        "max_ms": round(1000 * max(values), 1),
    }


def statement_counts(run: dict[str, Any]) -> list[dict[str, Any]]:
    """The statements one probe run sent before its first claim, counted by their start."""
    before = [s["sql"] for s in run["statements"] if s["at"] < run["first_claim"]]
    counted = collections.Counter(before)
    return [{"sql": sql, "count": n} for sql, n in sorted(counted.items(), key=lambda i: -i[1])]


def summarise(runs: list[dict[str, Any]], probes: list[dict[str, Any]]) -> dict[str, Any]:
    """One variant's figures: launch to first claim (time, CPU), to exit, and the phases."""
    by_phase: dict[str, list[float]] = {}
    cpu_by_phase: dict[str, list[float]] = {}
    for probe in probes:
        for phase, seconds in phases(probe).items():
            by_phase.setdefault(phase, []).append(seconds)
        for phase, seconds in phases(probe, "cpu").items():
            cpu_by_phase.setdefault(phase, []).append(seconds)
    return {
        "first_claim": ms([r["first_claim"] for r in runs]),
        "first_claim_cpu_s": round(statistics.median(r["first_claim_cpu"] for r in runs), 3),
        "worker_started": ms([r["started"] for r in runs]),
        "exit": ms([r["exit"] for r in runs]),
        "phases_ms": {p: round(1000 * statistics.median(v), 1) for p, v in by_phase.items()},
        "phases_cpu_ms": {
            p: round(1000 * statistics.median(v), 1) for p, v in cpu_by_phase.items()
        },
        "probe_first_claim": ms([p["first_claim"] for p in probes]),
        "statements_before_first_claim": statistics.median(
            len([s for s in p["statements"] if s["at"] < p["first_claim"]]) for p in probes
        ),
        "statements": statement_counts(probes[0]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=11)
    parser.add_argument("--events", type=int, default=5000)
    parser.add_argument("--base", help="also run outbox at this revision (before and after)")
    args = parser.parse_args()
    if args.repeat < 1 or args.events < 1:
        parser.error("--repeat and --events must be positive")
    python = sys.executable
    outbox = str(Path(python).parent / "outbox")
    url = scratch_database(DATABASE)
    dsn = libpq_url(url)
    prepare(url)
    results: dict[str, Any] = {
        "benchmark": "startup",
        "command": command_line("benchmarks.startup", args),
        "machine": machine(),
        "events": args.events,
        "repeat": args.repeat,
    }
    floors: dict[str, list[dict[str, float]]] = {name: [] for name in FLOORS}
    kept: dict[tuple[str, int], list[dict[str, Any]]] = {}
    probed: dict[tuple[str, int], list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="outbox-startup-") as scratch:
        trees = {"head": ROOT}
        if args.base:
            trees["base"] = Path(scratch) / "base"
            subprocess.run(
                ["git", "worktree", "add", "--detach", str(trees["base"]), args.base],
                cwd=ROOT,
                check=True,
                capture_output=True,
            )
        probe = Path(scratch) / PROBE.name  # run by path, so that it imports the tree's outbox
        probe.write_text(PROBE.read_text())
        try:
            for repeat in range(args.repeat):
                for name, code in FLOORS.items():
                    floors[name].append(floor(python, code))
                for revision, tree in trees.items():
                    for processes in (1, 2):
                        load(dsn, args.events)
                        run = launch([outbox, *work_command(url, processes)], tree)
                        kept.setdefault((revision, processes), []).append(run)
                        load(dsn, args.events)
                        marked = launch(
                            [python, str(probe), *work_command(url, processes)],
                            tree,
                            probe_marks=True,
                        )
                        probed.setdefault((revision, processes), []).append(marked)
                        if remaining(dsn):
                            raise RuntimeError("a run left events behind")
                print(f"repeat {repeat + 1}/{args.repeat} done", flush=True)
            results["floors"] = {
                name: {
                    **ms([r["seconds"] for r in runs]),
                    "cpu_s": round(statistics.median(r["cpu"] for r in runs), 3),
                }
                for name, runs in floors.items()
            }
            results["variants"] = [
                {
                    "revision": args.base if revision == "base" else "head",
                    "processes": processes,
                    **summarise(runs, probed[(revision, processes)]),
                }
                for (revision, processes), runs in kept.items()
            ]
            results["importtime"] = {
                revision: importtime(python, tree, url) for revision, tree in trees.items()
            }
        finally:
            drop_database(DATABASE)
            if args.base:
                subprocess.run(
                    ["git", "worktree", "remove", "--force", str(trees["base"])],
                    cwd=ROOT,
                    check=False,
                )
    print(json.dumps(results["variants"], indent=1)[:4000])
    print(f"results in {write('startup', results)}")


if __name__ == "__main__":
    main()
