"""Every signal the ``outbox`` command handles, in one place: a worker's two-stage stop,
several worker processes from one ``outbox work`` command (``--processes N``, POSIX), a
Ctrl-C the demo checks for between steps (:func:`interrupt_flag`), and the stop request of
``outbox run --once`` (:func:`stop_flag`).

The parent loads the application once (imports, mappers, the schema check) and then forks the
workers: N processes pay for one start-up, and share the loaded code's memory pages. It stays
behind as a small supervisor: it passes a stop request on to every worker, starts a new one in
place of a worker that died without being asked to stop, and exits once all have exited.

Signals: the parent turns SIGTERM and SIGINT into a SIGTERM for each worker; the workers
themselves ignore SIGINT, so that a Ctrl-C, which the terminal sends to the whole process
group, counts once. A worker whose parent has gone (killed with SIGKILL) stops gracefully, as
if it had been sent SIGTERM.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import contextmanager
from types import FrameType
from typing import TypeVar

from outbox._core import log as _log
from outbox.worker import Worker

log = _log.get_logger(__name__)

# The most worker processes one command runs. They are for CPU-bound handlers, where more
# processes than cores gain nothing, and this is more cores than a large server has; each
# process also holds database connections of its own. A larger number is a typo.
MAX_PROCESSES = 256
RESTART_DELAY_SECONDS = 1.0
MAX_RESTART_DELAY_SECONDS = 30.0
STEADY_SECONDS = 60.0
"""A worker that ran this long before dying is restarted after the shortest delay again."""
ORPHAN_CHECK_SECONDS = 1.0
PLAN_POLL_SECONDS = 0.2
"""How often a supervisor that reads its plan again looks whether a worker has exited."""
K = TypeVar("K", bound=Hashable)
STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})


@contextmanager
def interrupt_flag() -> Iterator[threading.Event]:
    """Ctrl-C as a flag the caller checks between steps: the first SIGINT sets it, a second
    raises KeyboardInterrupt at once.

    Python's own handler raises KeyboardInterrupt wherever the main thread is, and drops it
    ("Exception ignored") when that is a finalizer or a weakref callback, of which SQLAlchemy's
    ORM runs many: the Ctrl-C is lost, and the command goes on as if none had come.
    """
    interrupted = threading.Event()

    def handle(signum: int, frame: FrameType | None) -> None:
        if interrupted.is_set():
            raise KeyboardInterrupt
        interrupted.set()

    previous = signal.signal(signal.SIGINT, handle)
    try:
        yield interrupted
    finally:
        signal.signal(signal.SIGINT, previous)


@contextmanager
def stop_flag(signals: frozenset[signal.Signals] = STOP_SIGNALS) -> Iterator[threading.Event]:
    """A stop request as a flag for a command that finishes what it holds and exits (``outbox
    run --once``): the first SIGTERM or SIGINT sets it; a second one ends the process at once,
    as the signal's default would."""
    stop = threading.Event()

    def handle(signum: int, frame: FrameType | None) -> None:
        if stop.is_set():
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        stop.set()

    previous = {signum: signal.signal(signum, handle) for signum in signals}
    try:
        yield stop
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def supervise(
    plan: Callable[[], Sequence[K]],
    run_worker: Callable[[K], int],
    *,
    restart: bool,
    usage_error: int,
    final: int | None = None,
    replan_every: float | None = None,
    serving: K | None = None,
) -> int:
    """Fork a worker for each unit ``plan()`` lists, each running ``run_worker(unit)`` and
    exiting with its result.

    ``run_worker`` starts with SIGTERM and SIGINT blocked: it installs its SIGTERM handler,
    then unblocks them (:func:`unblock_stop_signals`), so that no stop request is lost.
    ``restart``: start a new worker in place of one that dies with a failure while no stop
    was asked (not in burst mode, where a failure is the outcome). A worker that exits with
    ``usage_error`` met a problem no restart can mend (its metrics port taken, say): the
    others are stopped and that code is returned. A worker that exits with ``final`` stopped
    for a reason a restart would meet again (the schema is one it may not work on): it is not
    restarted, and counts as a failure. Otherwise returns 0 when every worker exited with 0
    or was to be restarted when the stop came, else 1.

    ``replan_every``: seconds between readings of ``plan()`` while the workers run (a tenant
    registry): a unit it newly lists gets a worker, a unit it no longer lists has its worker
    stopped (SIGTERM, not restarted, not a failure). A reading that raises is logged and
    changes nothing.

    ``serving``: a unit ``plan()`` lists that serves the others (their metrics): stopped, as
    retired, once it is the only one left.
    """
    children: dict[int, tuple[K, float]] = {}  # pid -> (unit, started at)
    retired: set[K] = set()
    stopping = False
    failed = False
    result: int | None = None
    delays: dict[K, float] = {}

    def forward(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        for pid in children:
            _kill(pid, signal.SIGTERM)

    def spawn(unit: K) -> None:
        # Blocked across the fork: the parent must know the child before it forwards a stop,
        # and the child must not run the parent's handler.
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            pid = os.fork()
            if pid == 0:
                _become_worker(unit, run_worker)
            children[pid] = (unit, time.monotonic())
        finally:
            unblock_stop_signals()

    def replan() -> None:
        try:
            wanted = list(plan())
        except Exception as error:  # a registry that failed this time: keep what runs
            log.warning(_log.WORKER_PLAN_FAILED, error=f"{type(error).__name__}: {error}")
            return
        running = {unit: pid for pid, (unit, _) in children.items()}
        for unit in wanted:
            if unit not in running:
                retired.discard(unit)
                spawn(unit)
        for unit, pid in running.items():
            if unit not in wanted:
                retired.add(unit)
                _kill(pid, signal.SIGTERM)

    previous = {s: signal.signal(s, forward) for s in STOP_SIGNALS}
    try:
        for unit in plan():
            spawn(unit)
        next_plan = None if replan_every is None else time.monotonic() + replan_every
        while children:
            alone = [p for p, (u, _) in children.items() if u == serving and u not in retired]
            if alone and len(children) == 1:
                # Nothing left to serve, and nothing to restart: burst workers that are done,
                # a registry emptied. (Checked here, after a restart has spawned its worker.)
                retired.add(children[alone[0]][0])
                _kill(alone[0], signal.SIGTERM)
            if next_plan is None:
                pid, status = os.wait()
            else:
                pid, status = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    if not stopping and time.monotonic() >= next_plan:
                        replan()
                        next_plan = time.monotonic() + (replan_every or 0.0)
                    time.sleep(PLAN_POLL_SECONDS)
                    continue
            if pid not in children:
                continue
            unit, started = children.pop(pid)
            code = os.waitstatus_to_exitcode(status)
            if unit in retired:
                retired.discard(unit)
                continue
            if code == 0:
                continue
            log.warning(_log.WORKER_PROCESS_EXITED, pid=pid, index=unit, exit_code=code)
            if code == usage_error:
                forward(signal.SIGTERM, None)
                result = usage_error
                continue
            if stopping or not restart or code == final:
                failed = True
                continue
            delay = _restart_delay(delays, unit, time.monotonic() - started)
            log.warning(_log.WORKER_PROCESS_RESTARTING, index=unit, delay=delay)
            _sleep_unless_stopping(delay, lambda: stopping)
            # A stop asked for while its restart waited: it ends as the others do, and the
            # death that came before the stop was logged (a restart was to mend it).
            if not stopping:
                spawn(unit)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if result is not None:
        return result
    return 1 if failed else 0


def unblock_stop_signals() -> None:
    """Let SIGTERM and SIGINT through again (a no-op where they were not blocked, or where the
    platform has no signal masks: there is no fork there either)."""
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def _become_worker(index: K, run_worker: Callable[[K], int]) -> None:
    """The forked child: run one worker, then leave without returning into the parent's code."""
    code = 1
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        _watch_parent(os.getppid())
        code = run_worker(index)
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 0 if exit_.code is None else 1
    except BaseException:  # whatever happens, the child must not return into the parent's code
        log.exception(_log.WORKER_PROCESS_FAILED, index=index)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _watch_parent(parent: int) -> None:
    """Send this worker SIGTERM once its parent has gone (the worker is then re-parented)."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(ORPHAN_CHECK_SECONDS)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="outbox-parent-watch", daemon=True).start()


def _restart_delay(delays: dict[K, float], index: K, lived: float) -> float:
    """Back off a worker that keeps dying young; start over once one ran steadily."""
    if lived >= STEADY_SECONDS:
        delays[index] = RESTART_DELAY_SECONDS
    delay = delays.setdefault(index, RESTART_DELAY_SECONDS)
    delays[index] = min(delay * 2, MAX_RESTART_DELAY_SECONDS)
    return delay


def _sleep_unless_stopping(seconds: float, stopping: Callable[[], bool]) -> None:
    deadline = time.monotonic() + seconds
    while not stopping() and time.monotonic() < deadline:
        time.sleep(min(0.1, deadline - time.monotonic()))


def _kill(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # exited meanwhile: os.wait collects it
        os.kill(pid, signum)


@contextmanager
def stop_on_signals(worker: Worker, signals: tuple[signal.Signals, ...]) -> Iterator[None]:
    """First of ``signals``: stop gracefully. Second: abandon in-flight work at once."""
    received = 0

    def handle(signum: int, frame: FrameType | None) -> None:
        nonlocal received
        received += 1
        if received == 1:
            worker.stop()
        else:
            worker.abort()

    previous = {s: signal.signal(s, handle) for s in signals}
    # A forked worker starts with them blocked (see supervise), so that none is lost before now.
    unblock_stop_signals()
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
