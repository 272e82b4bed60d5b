"""Every kind of callable an application may register as a handler, built around one recorder.

``HANDLER_KINDS`` lists them; ``kind.build(record)`` returns a handler of that kind which, called
with a batch, calls ``record(batch)`` (an async kind after an ``await``, so that a coroutine that
is never awaited records nothing). Tests parametrize over the list with ``ids=kind_id``.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from outbox import Batch

Record = Callable[[Batch[Any]], None]


@dataclass(frozen=True)
class HandlerKind:
    """One way of writing a handler."""

    name: str
    build: Callable[[Record], Any]
    is_async: bool
    """Whether outbox should see it as async at registration (it returns a coroutine)."""


def kind_id(kind: HandlerKind) -> str:
    """The test id of a kind."""
    return kind.name


async def _record_later(record: Record, batch: Batch[Any]) -> None:
    await asyncio.sleep(0)
    record(batch)


def _record_now(record: Record, batch: Batch[Any]) -> None:
    record(batch)


def _function(record: Record) -> Any:
    def handle(batch: Batch[Any]) -> None:
        record(batch)

    return handle


def _async_function(record: Record) -> Any:
    async def handle(batch: Batch[Any]) -> None:
        await _record_later(record, batch)

    return handle


class _CallableObject:
    def __init__(self, record: Record) -> None:
        self.record = record

    def __call__(self, batch: Batch[Any]) -> None:
        self.record(batch)


class _AsyncCallableObject:
    def __init__(self, record: Record) -> None:
        self.record = record

    async def __call__(self, batch: Batch[Any]) -> None:
        await _record_later(self.record, batch)


class _Methods:
    def __init__(self, record: Record) -> None:
        self.record = record

    def handle(self, batch: Batch[Any]) -> None:
        self.record(batch)

    async def handle_async(self, batch: Batch[Any]) -> None:
        await _record_later(self.record, batch)


def _static_methods(record: Record) -> type:
    class Handlers:
        @staticmethod
        def handle(batch: Batch[Any]) -> None:
            record(batch)

        @staticmethod
        async def handle_async(batch: Batch[Any]) -> None:
            await _record_later(record, batch)

    return Handlers


def _class_methods(record: Record) -> type:
    class Handlers:
        @classmethod
        def handle(cls, batch: Batch[Any]) -> None:
            record(batch)

        @classmethod
        async def handle_async(cls, batch: Batch[Any]) -> None:
            await _record_later(record, batch)

    return Handlers


def _mark_coroutine_function(func: Any) -> Any:
    mark = getattr(inspect, "markcoroutinefunction", None)  # Python 3.12+
    if mark is not None:
        return mark(func)
    # Before 3.12, asgiref's markcoroutinefunction sets the mark asyncio.iscoroutinefunction reads.
    func._is_coroutine = asyncio.coroutines._is_coroutine  # type: ignore[attr-defined]
    return func


def _marked(record: Record) -> Any:
    def handle(batch: Batch[Any]) -> Any:
        return _record_later(record, batch)

    return _mark_coroutine_function(handle)


def _plain_decorator_around_async(record: Record) -> Any:
    async def handle(batch: Batch[Any]) -> None:
        await _record_later(record, batch)

    @functools.wraps(handle)
    def logged(batch: Batch[Any]) -> Any:
        return handle(batch)

    return logged


HANDLER_KINDS = [
    HandlerKind("function", _function, is_async=False),
    HandlerKind("async_function", _async_function, is_async=True),
    HandlerKind("callable_object", _CallableObject, is_async=False),
    HandlerKind("async_callable_object", _AsyncCallableObject, is_async=True),
    HandlerKind("partial", lambda r: functools.partial(_record_now, r), is_async=False),
    HandlerKind("async_partial", lambda r: functools.partial(_record_later, r), is_async=True),
    HandlerKind("bound_method", lambda r: _Methods(r).handle, is_async=False),
    HandlerKind("async_bound_method", lambda r: _Methods(r).handle_async, is_async=True),
    HandlerKind("staticmethod", lambda r: _static_methods(r).handle, is_async=False),
    HandlerKind("async_staticmethod", lambda r: _static_methods(r).handle_async, is_async=True),
    # The staticmethod object itself, as a decorator sees it inside a class body.
    HandlerKind(
        "staticmethod_object",
        lambda r: _static_methods(r).__dict__["handle"],
        is_async=False,
    ),
    HandlerKind(
        "async_staticmethod_object",
        lambda r: _static_methods(r).__dict__["handle_async"],
        is_async=True,
    ),
    HandlerKind("classmethod", lambda r: _class_methods(r).handle, is_async=False),
    HandlerKind("async_classmethod", lambda r: _class_methods(r).handle_async, is_async=True),
    HandlerKind(
        "partial_of_async_bound_method",
        lambda r: functools.partial(_Methods(r).handle_async),
        is_async=True,
    ),
    HandlerKind("marked_coroutine_function", _marked, is_async=True),
    # Sync as declared, but returns the coroutine: outbox finds out only when it calls it.
    HandlerKind("plain_decorator_around_async", _plain_decorator_around_async, is_async=False),
]
