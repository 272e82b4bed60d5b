"""The supervisor of ``outbox work``'s processes, with a unit that serves the others (the
metrics of several databases): kept while a worker is restarted, stopped once alone."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from outbox.cli._signals import RESTART_DELAY_SECONDS, supervise, unblock_stop_signals

SERVING = ("metrics", 0)
WORKER = ("worker", 0)
OTHER = ("worker", 1)


def test_the_serving_unit_outlives_a_worker_s_restart_and_stops_once_alone(
    tmp_path: Path,
) -> None:
    """The one worker crashes once and is restarted: the serving unit is still there for the
    restarted worker; once the worker is done, the serving unit is stopped and the
    supervisor returns."""
    crashed, served_by, seen = tmp_path / "crashed", tmp_path / "served_by", tmp_path / "seen"

    def run(unit: tuple[str, int]) -> int:
        signal.signal(signal.SIGTERM, lambda signum, frame: os._exit(0))
        unblock_stop_signals()
        if unit == SERVING:
            served_by.write_text(str(os.getpid()))
            while True:
                time.sleep(0.05)
        if not crashed.exists():
            crashed.touch()
            time.sleep(0.3)  # the serving unit has started meanwhile
            return 1
        try:
            os.kill(int(served_by.read_text()), 0)
            seen.write_text("alive")
        except ProcessLookupError:
            seen.write_text("gone")
        return 0

    code = supervise(lambda: [WORKER, SERVING], run, restart=True, usage_error=2, serving=SERVING)
    assert (0, "alive") == (code, seen.read_text())


def test_a_stop_while_a_worker_waits_for_its_restart_ends_with_success(tmp_path: Path) -> None:
    """One worker dies; while it waits for its restart, the supervisor is asked to stop: the
    other worker stops, the dead one is not started again, and the supervisor returns 0, as
    when the stop comes after the restart (a restart was to mend the death)."""
    runs = tmp_path / "runs"

    def run(unit: tuple[str, int]) -> int:
        signal.signal(signal.SIGTERM, lambda signum, frame: os._exit(0))
        unblock_stop_signals()
        if unit == WORKER:
            with runs.open("a") as file:
                file.write("run\n")
            return 1
        deadline = time.monotonic() + 10.0
        while not runs.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(RESTART_DELAY_SECONDS / 2)  # within the dead worker's restart delay
        os.kill(os.getppid(), signal.SIGTERM)
        time.sleep(10.0)  # stopped by the supervisor's SIGTERM
        return 1

    code = supervise(lambda: [WORKER, OTHER], run, restart=True, usage_error=2)
    assert (0, ["run"]) == (code, runs.read_text().split())
