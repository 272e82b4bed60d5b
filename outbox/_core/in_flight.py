"""At most one call in flight per key, on a thread of its own: how the console and the
Prometheus collector of several databases read each of them without letting one that hangs
pile up threads (each read of a database that does not answer joins the one already waiting
on it)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")


class InFlight:
    """Calls by key, each run on a daemon thread of its own; a key whose call has not returned
    gets that call back rather than a second one.

    A thread of its own rather than the event loop's thread pool: a call that hangs (a database
    that accepts and never answers, until ``Settings.network_timeout``) must not take a worker
    of the pool every page and endpoint shares.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._lock = threading.Lock()
        self._calls: dict[Hashable, Future[Any]] = {}

    def start(self, key: Hashable, work: Callable[[], T]) -> Future[T]:
        """The call of ``key`` under way, or ``work`` started now when there is none."""
        with self._lock:
            running = self._calls.get(key)
            if running is not None and not running.done():
                return running
            future: Future[T] = Future()
            # Running from the start: a caller cannot cancel it, and its result is always set.
            future.set_running_or_notify_cancel()
            self._calls[key] = future
        threading.Thread(
            target=_run, args=(future, work), name=f"{self._name} {key}", daemon=True
        ).start()
        return future

    def running(self) -> int:
        """How many calls have not returned."""
        with self._lock:
            return sum(not call.done() for call in self._calls.values())

    def forget(self, keep: Iterable[Hashable]) -> None:
        """Forget the finished calls of keys not in ``keep`` (databases no longer listed)."""
        kept = set(keep)
        with self._lock:
            for key in [k for k, call in self._calls.items() if k not in kept and call.done()]:
                del self._calls[key]


def _run(future: Future[T], work: Callable[[], T]) -> None:
    try:
        result = work()
    except BaseException as error:  # handed to whoever waits, as the call's outcome
        future.set_exception(error)
    else:
        future.set_result(result)
