"""Calling a handler, sync or async, within its timeout: the one place a handler is called.

A sync handler is called in the worker's thread; with a ``timeout``, in a thread of its own
that may be left behind, as a thread cannot be stopped from outside. An async handler runs on
one event loop per process, in a daemon thread of its own started on first use; the worker
thread submits the coroutine and waits for it. One long-lived loop rather than a loop per call
(``asyncio.run``): clients bound to a loop, such as an ``httpx.AsyncClient`` kept in a module
global, keep working from one batch to the next. Each worker thread waits for one coroutine at
a time, so a worker with ``concurrency`` N has up to N coroutines in flight on the loop. A
coroutine that overruns its ``timeout`` is cancelled.

Whether a callable is async is decided once, at registration
(:func:`outbox._core.handler_kind.is_async`), and what outbox cannot call correctly is refused there
(:func:`outbox._core.handler_kind.refusal`), never run the wrong way.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from outbox.exceptions import HandlerTimeoutError

if TYPE_CHECKING:
    from outbox.batch import Batch
    from outbox.handler import Handler

CANCEL_WAIT_SECONDS = 1.0
"""How long a cancelled coroutine may take to run its cleanup (``finally``, ``async with``)
before its attempt is recorded as failed, or its worker stops, without waiting further."""


class HandlerAbandoned(Exception):  # noqa: N818 - an outcome between two library modules
    """The handler's coroutine was cancelled because its worker stopped: no outcome is written."""


# --- calling -----------------------------------------------------------------------------------


def call(handler: Handler[Any], batch: Batch[Any]) -> None:
    """Call ``handler`` with ``batch`` and wait for it; what it raises fails the attempt, and
    so does overrunning its ``timeout`` (:class:`HandlerTimeoutError`)."""
    deadline = None if handler.timeout is None else time.monotonic() + handler.timeout
    if handler.is_async:
        _run_on_loop(handler, functools.partial(handler.func, batch), deadline)
        return
    result = _call_sync(handler, batch)
    if result is not None and inspect.isawaitable(result):
        # A sync callable that returned an awaitable (a plain decorator around an async
        # function): the handler's work is in it, so it runs on the loop, within what is left
        # of the timeout. Reporting success without running it would lose the group.
        _run_on_loop(handler, lambda: result, deadline)


def call_hook(handler: Handler[Any], hook: Callable[[], object]) -> None:
    """Call one of a handler object's hooks (``outbox_start``, ``outbox_stop``: see
    :mod:`outbox.lifecycle`) and wait for it; what it returns, when awaitable, runs on the
    process's event loop, where the handler's own coroutines run and its clients live."""
    result = hook()
    if result is not None and inspect.isawaitable(result):
        _run_on_loop(handler, lambda: result, None)


def _call_sync(handler: Handler[Any], batch: Batch[Any]) -> object:
    """Call a sync handler; with a ``timeout``, in a thread of its own that may be left behind.

    A thread cannot be stopped from outside: a handler that overruns keeps running, but its
    result is ignored (its job is already rescheduled), and the next attempt may start while
    it still runs.
    """
    if handler.timeout is None:
        return handler.func(batch)
    returned: list[object] = []
    raised: list[BaseException] = []
    done = threading.Event()

    def target() -> None:
        try:
            returned.append(handler.func(batch))
        except BaseException as error:  # handed to the waiting thread below
            raised.append(error)
        finally:
            done.set()

    threading.Thread(target=target, name=f"outbox-handler-{handler.name}", daemon=True).start()
    if not done.wait(handler.timeout):
        raise _timed_out(handler)
    if raised:
        raise raised[0]
    return returned[0]


def _timed_out(handler: Handler[Any]) -> HandlerTimeoutError:
    return HandlerTimeoutError(
        f"handler {handler.name!r} ran longer than its timeout of {handler.timeout:g} s"
    )


@dataclass(eq=False)
class _Call:
    """A coroutine a worker thread waits for."""

    future: concurrent.futures.Future[BaseException | None]
    ended: threading.Event
    abandoned: bool = False


def _run_on_loop(
    handler: Handler[Any], start: Callable[[], object], deadline: float | None
) -> None:
    """Run ``start()`` on the process's event loop, awaiting what it returns; wait for it."""
    runner = _state.runner()
    if threading.current_thread() is runner.thread:
        raise RuntimeError(
            f"handler {handler.name!r} cannot run from outbox's own event loop thread "
            "(is a handler draining outbox?)"
        )
    ended = threading.Event()
    me = threading.get_ident()
    with _state.lock:  # registered before it can start: a stopping worker must find it
        call = _Call(asyncio.run_coroutine_threadsafe(_run(start, ended), runner.loop), ended)
        _state.calls[me] = call
    try:
        timeout = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        finished, _ = concurrent.futures.wait([call.future], timeout)
        # cancel() fails only when it finished just as its time ran out: then it counts.
        if not finished and call.future.cancel():
            # Cancelled for real: give its cleanup a moment before the attempt is recorded.
            ended.wait(CANCEL_WAIT_SECONDS)
            raise _timed_out(handler)
        raised = call.future.result()
    except concurrent.futures.CancelledError:
        if call.abandoned:
            raise HandlerAbandoned(f"handler {handler.name!r}: its worker stopped") from None
        raise RuntimeError(
            f"handler {handler.name!r}: its coroutine was cancelled before it finished"
        ) from None
    finally:
        with _state.lock:
            _state.calls.pop(me, None)
    if raised is not None:
        raise raised


async def _run(start: Callable[[], object], ended: threading.Event) -> BaseException | None:
    try:
        result = start()
        if inspect.isawaitable(result):
            await result
    except (SystemExit, KeyboardInterrupt) as error:
        # Raised out of a task, these would stop the loop, and with it every async handler of
        # the process: they are handed to the waiting thread, as a sync handler's would be.
        return error
    finally:
        ended.set()
    return None


def cancel_calls_from(threads: Iterable[threading.Thread]) -> int:
    """Cancel the coroutines these threads wait for, as their worker stops without them.

    Their threads get :class:`HandlerAbandoned`: no outcome is written, the jobs' leases expire
    and other workers rescue the groups. Waits up to ``CANCEL_WAIT_SECONDS`` for their cleanup.
    Returns how many were cancelled.
    """
    idents = {thread.ident for thread in threads}
    with _state.lock:
        calls = [call for ident, call in _state.calls.items() if ident in idents]
    for call in calls:
        call.abandoned = True
        call.future.cancel()
    deadline = time.monotonic() + CANCEL_WAIT_SECONDS
    for call in calls:
        call.ended.wait(max(deadline - time.monotonic(), 0.0))
    return len(calls)


# --- the event loop of the process ---------------------------------------------------------------


class _LoopThread:
    """An event loop running forever in a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._main, name="outbox-event-loop", daemon=True)
        self.thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()


@dataclass(eq=False)
class _ProcessState:
    """The loop and the calls in flight; a forked child starts with none of its parent's."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    calls: dict[int, _Call] = field(default_factory=dict)
    _runner: _LoopThread | None = None

    def runner(self) -> _LoopThread:
        """The process's loop thread, started on first use."""
        runner = self._runner
        if runner is None:
            with self.lock:
                if self._runner is None:
                    self._runner = _LoopThread()
                runner = self._runner
        return runner

    def reset(self) -> None:
        # The parent's loop thread does not exist in the child (fork copies only the forking
        # thread), and its lock may have been held at the fork: start again from nothing.
        self.lock = threading.Lock()
        self.calls = {}
        self._runner = None


_state = _ProcessState()

if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_state.reset)
