"""Calling handlers: each kind classified and called correctly, sync or async; refused kinds."""

from __future__ import annotations

import asyncio
import functools
import os
import select
import signal
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from outbox import Batch, ConfigurationError, Handler, HandlerTimeoutError, Outbox, RetryPolicy
from outbox._core import handler_kind as _handler_kind
from outbox._engine import invoke as _invoke
from outbox.urgency import Urgency
from tests.handler_kinds import HANDLER_KINDS, HandlerKind, kind_id
from tests.models import ActivityEvent

WAIT_SECONDS = 10.0


def _handler(func: Any, *, timeout: float | None = None, name: str = "kind") -> Handler[Any]:
    return Handler(
        name=name,
        model=ActivityEvent,
        func=func,
        batch_size=10,
        urgency=Urgency.HOUR,
        retry=RetryPolicy(),
        archive=False,
        max_batches=1,
        timeout=timeout,
    )


def _batch(*ids: int) -> Batch[ActivityEvent]:
    events = [ActivityEvent(id=i, activity_id=i) for i in ids or (1, 2, 3)]
    return Batch(events, group_id=uuid.uuid4(), attempt=1, handler="kind")


# --- classification ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", HANDLER_KINDS, ids=kind_id)
def test_each_kind_is_classified_sync_or_async(kind: HandlerKind) -> None:
    """Registration tells async callables (coroutine-returning) from sync ones, for each kind."""
    handler = _handler(kind.build(lambda batch: None))
    assert kind.is_async == handler.is_async


@pytest.mark.parametrize("kind", HANDLER_KINDS, ids=kind_id)
@pytest.mark.parametrize("timeout", [None, WAIT_SECONDS], ids=["no_timeout", "timeout"])
def test_each_kind_is_called_with_the_batch_and_runs(
    kind: HandlerKind, timeout: float | None
) -> None:
    """Each kind of handler runs to its end with the batch, with and without a timeout."""
    seen: list[list[int]] = []
    batch = _batch(4, 5)
    _invoke.call(_handler(kind.build(lambda b: seen.append(b.ids)), timeout=timeout), batch)
    assert [[4, 5]] == seen


def _named(name: str) -> Any:
    def handle(batch: Batch[Any]) -> None: ...

    handle.__name__ = name
    return handle


class _Sender:
    def __call__(self, batch: Batch[Any]) -> None: ...

    def deliver(self, batch: Batch[Any]) -> None: ...


@pytest.mark.parametrize(
    ("func", "expected"),
    [
        (_named("push"), "push"),
        (functools.partial(lambda topic, batch: None, "t"), "<lambda>"),
        (functools.partial(_named("push")), "push"),
        (_Sender(), "_Sender"),
        (_Sender().deliver, "deliver"),
    ],
    ids=["function", "partial_of_lambda", "partial", "callable_object", "bound_method"],
)
def test_default_name_is_the_function_s_or_the_class_s(func: Any, expected: str) -> None:
    """Without name=, a handler is named after its function (through partials) or its class."""
    assert expected == _handler_kind.default_name(func)


def test_a_callable_object_registers_under_its_class_name() -> None:
    """@app.handler on a callable object with no name= registers it under its class's name."""
    app = Outbox("sqlite://")
    app.handler(ActivityEvent)(_Sender())
    assert ["_Sender"] == list(app.handlers)


# --- refused at registration -------------------------------------------------------------------


def _generator(batch: Batch[Any]) -> Iterator[int]:
    yield len(batch)


async def _async_generator(batch: Batch[Any]) -> AsyncIterator[int]:
    yield len(batch)


class _GeneratorObject:
    def __call__(self, batch: Batch[Any]) -> Iterator[int]:
        yield len(batch)


def _no_parameter() -> None: ...


def _two_parameters(batch: Batch[Any], client: object) -> None: ...


def _keyword_only(*, batch: Batch[Any]) -> None: ...


async def _async_two_parameters(batch: Batch[Any], client: object) -> None: ...


class _NoBatchMethod:
    def handle(self) -> None: ...


REFUSED = [
    ("not_callable", "handler.py", "is not callable"),
    ("generator", _generator, "generator function"),
    ("async_generator", _async_generator, "async generator function"),
    ("generator_object", _GeneratorObject(), "generator function"),
    ("partial_of_generator", functools.partial(_generator), "generator function"),
    ("no_parameter", _no_parameter, "cannot take the batch"),
    ("two_parameters", _two_parameters, "cannot take the batch"),
    ("keyword_only", _keyword_only, "cannot take the batch"),
    ("async_two_parameters", _async_two_parameters, "cannot take the batch"),
    ("method_without_batch", _NoBatchMethod().handle, "cannot take the batch"),
    ("classmethod_object", classmethod(_two_parameters), "is not callable"),
]


@pytest.mark.parametrize(("func", "says"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
def test_handlers_outbox_cannot_call_correctly_are_refused_at_registration(
    func: Any, says: str
) -> None:
    """Registration refuses them in one line naming the handler and what is wrong."""
    app = Outbox("sqlite://")
    with pytest.raises(ConfigurationError) as refused:
        app.handler(ActivityEvent, name="push")(func)
    message = str(refused.value)
    assert (True, True, False, {}) == (
        message.startswith("handler 'push'"),
        says in message,
        "\n" in message,
        dict(app.handlers),
    )


# --- async calls -------------------------------------------------------------------------------


def test_async_handlers_share_one_loop_in_a_thread_of_its_own() -> None:
    """Every async call runs on the same event loop, outside the calling thread."""
    seen: list[tuple[asyncio.AbstractEventLoop, int]] = []

    async def handle(batch: Batch[Any]) -> None:
        seen.append((asyncio.get_running_loop(), threading.get_ident()))

    handler = _handler(handle)
    _invoke.call(handler, _batch())
    _invoke.call(handler, _batch())
    loops, threads = {loop for loop, _ in seen}, {ident for _, ident in seen}
    assert (1, 1, False) == (len(loops), len(threads), threading.get_ident() in threads)


def test_async_handler_error_fails_the_call_with_its_own_exception() -> None:
    """What an async handler raises reaches the caller as is."""

    async def handle(batch: Batch[Any]) -> None:
        await asyncio.sleep(0)
        raise LookupError("the downstream said no")

    with pytest.raises(LookupError, match="the downstream said no"):
        _invoke.call(_handler(handle), _batch())


def test_timeout_of_async_handler_cancels_its_coroutine() -> None:
    """An async handler over its timeout is cancelled: it sees CancelledError, the call fails."""
    cancelled = threading.Event()

    async def handle(batch: Batch[Any]) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    with pytest.raises(HandlerTimeoutError):
        _invoke.call(_handler(handle, timeout=0.1), _batch())
    assert cancelled.is_set()


def test_handler_s_own_timeout_error_is_not_taken_for_outbox_s() -> None:
    """A TimeoutError the handler raises fails the call as itself, not as HandlerTimeoutError."""

    async def handle(batch: Batch[Any]) -> None:
        await asyncio.wait_for(asyncio.Event().wait(), 0.01)

    with pytest.raises(TimeoutError) as raised:
        _invoke.call(_handler(handle, timeout=WAIT_SECONDS), _batch())
    assert not isinstance(raised.value, HandlerTimeoutError)


def test_awaitable_from_a_sync_callable_runs_within_what_is_left_of_the_timeout() -> None:
    """The coroutine a sync wrapper returns is awaited, and cancelled past the timeout."""
    cancelled = threading.Event()

    async def handle(batch: Batch[Any]) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    def wrapper(batch: Batch[Any]) -> Any:
        return handle(batch)

    with pytest.raises(HandlerTimeoutError):
        _invoke.call(_handler(wrapper, timeout=0.1), _batch())
    assert cancelled.is_set()


def test_coroutine_cancelled_from_within_fails_the_call() -> None:
    """A coroutine that ends cancelled without outbox asking fails the call; never a success."""

    async def handle(batch: Batch[Any]) -> None:
        raise asyncio.CancelledError

    with pytest.raises(RuntimeError, match="cancelled before it finished"):
        _invoke.call(_handler(handle), _batch())


def test_system_exit_in_async_handler_fails_the_call_and_the_loop_lives_on() -> None:
    """SystemExit from a coroutine reaches the caller; the loop still runs the next handler."""
    seen: list[list[int]] = []

    async def exits(batch: Batch[Any]) -> None:
        raise SystemExit(3)

    async def records(batch: Batch[Any]) -> None:
        seen.append(batch.ids)

    with pytest.raises(SystemExit):
        _invoke.call(_handler(exits), _batch())
    _invoke.call(_handler(records), _batch(7))
    assert [[7]] == seen


def test_calls_from_several_threads_are_in_flight_on_the_loop_at_once() -> None:
    """Each calling thread has its coroutine on the loop at the same time as the others'."""
    count = 3
    barrier = asyncio.Barrier(count)
    passed: list[int] = []

    async def handle(batch: Batch[Any]) -> None:
        await asyncio.wait_for(barrier.wait(), WAIT_SECONDS)
        passed.append(batch.ids[0])

    handler = _handler(handle)
    threads = [
        threading.Thread(target=_invoke.call, args=(handler, _batch(n)), daemon=True)
        for n in range(count)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_SECONDS * 2)
    assert [0, 1, 2] == sorted(passed)


def test_async_handler_runs_when_called_from_inside_a_running_loop() -> None:
    """A caller that is itself in a running event loop (an async test) still gets it run."""
    seen: list[list[int]] = []

    async def handle(batch: Batch[Any]) -> None:
        await asyncio.sleep(0)
        seen.append(batch.ids)

    async def caller() -> None:
        _invoke.call(_handler(handle), _batch(9))

    asyncio.run(caller())
    assert [[9]] == seen


def test_calling_from_outbox_s_own_loop_is_refused_not_deadlocked() -> None:
    """An async handler that calls another handler through outbox fails instead of hanging."""

    async def inner(batch: Batch[Any]) -> None: ...

    async def outer(batch: Batch[Any]) -> None:
        _invoke.call(_handler(inner), batch)

    with pytest.raises(RuntimeError, match="own event loop thread"):
        _invoke.call(_handler(outer, timeout=WAIT_SECONDS), _batch())


def test_cancelling_a_thread_s_call_abandons_it_and_cancels_its_coroutine() -> None:
    """cancel_calls_from cancels the coroutine a thread waits for; that thread gets abandoned."""
    started, cancelled = threading.Event(), threading.Event()
    outcome: list[BaseException] = []

    async def handle(batch: Batch[Any]) -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    def run() -> None:
        try:
            _invoke.call(_handler(handle), _batch())
        except BaseException as error:  # the outcome under test
            outcome.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert started.wait(WAIT_SECONDS)
    cancelled_calls = _invoke.cancel_calls_from([thread])
    thread.join(WAIT_SECONDS)
    assert (1, True, [_invoke.HandlerAbandoned]) == (
        cancelled_calls,
        cancelled.is_set(),
        [type(error) for error in outcome],
    )


def test_cancelling_leaves_other_threads_calls_running() -> None:
    """Only the named threads' coroutines are cancelled."""
    started, release = threading.Event(), threading.Event()
    seen: list[list[int]] = []

    async def handle(batch: Batch[Any]) -> None:
        started.set()
        while not release.is_set():
            await asyncio.sleep(0.01)
        seen.append(batch.ids)

    thread = threading.Thread(target=_invoke.call, args=(_handler(handle), _batch(5)), daemon=True)
    thread.start()
    assert started.wait(WAIT_SECONDS)
    bystander = threading.Thread(target=lambda: None)
    bystander.start()
    bystander.join()
    cancelled_calls = _invoke.cancel_calls_from([bystander])
    release.set()
    thread.join(WAIT_SECONDS)
    assert (0, [[5]]) == (cancelled_calls, seen)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork() is POSIX")
def test_a_forked_child_runs_async_handlers_on_a_loop_of_its_own() -> None:
    """The child never inherits the parent's loop thread: it starts its own and it works."""

    async def handle(batch: Batch[Any]) -> None:
        await asyncio.sleep(0)

    _invoke.call(_handler(handle), _batch())  # the parent's loop is running now
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, then leave without running the parent's test code
        code = 1
        try:
            inherited = _invoke._state._runner is not None
            _invoke.call(_handler(handle, timeout=5.0), _batch())
            os.write(write, b"inherited" if inherited else b"fresh")
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    try:
        ready, _, _ = select.select([read], [], [], WAIT_SECONDS)
        report = os.read(read, 100) if ready else b"(no report)"
    finally:
        os.close(read)
    deadline = time.monotonic() + WAIT_SECONDS
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    if done[0] == 0:  # still running: a hung child fails the test, and does not outlive it
        os.kill(pid, signal.SIGKILL)
        done = os.waitpid(pid, 0)
    assert (b"fresh", 0) == (report, os.waitstatus_to_exitcode(done[1]))
