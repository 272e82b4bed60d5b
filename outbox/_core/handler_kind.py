"""What kind of callable a handler is, read once at registration: async or not, the name it gets
when none is given, and why outbox cannot call it correctly (a refusal), never run the wrong way.

Below the application object (:mod:`outbox.app` asks it when a handler is registered) and the
engine (:mod:`outbox._engine.invoke` calls the handler as classified here): it imports neither.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import types
from collections.abc import Iterator

# Wrappers are unwrapped at most this deep: a callable object's __call__ could itself be a
# callable object, and so on.
_MAX_LAYERS = 32

# The mark asyncio.iscoroutinefunction recognises besides `async def`: set by asgiref's
# markcoroutinefunction before Python 3.12 (inspect.markcoroutinefunction since).
_ASYNCIO_MARK = getattr(asyncio.coroutines, "_is_coroutine", None)


def _layers(func: object) -> Iterator[object]:
    """``func`` and what calling it calls through: partials, bound methods, staticmethods, and
    a callable object's ``__call__``. Each layer returns what the next returns."""
    for _ in range(_MAX_LAYERS):
        yield func
        if isinstance(func, functools.partial):
            func = func.func
        elif isinstance(func, types.MethodType | staticmethod):
            func = func.__func__
        elif callable(func) and not inspect.isroutine(func) and not isinstance(func, type):
            func = type(func).__call__
        else:
            return


def _is_coroutine_function(func: object) -> bool:
    if inspect.iscoroutinefunction(func):
        return True
    return _ASYNCIO_MARK is not None and getattr(func, "_is_coroutine", None) is _ASYNCIO_MARK


def is_async(func: object) -> bool:
    """Does calling ``func`` return a coroutine to run: an ``async def`` function, a partial or
    bound method of one, an object whose ``__call__`` is one, or a function marked as one?"""
    return any(_is_coroutine_function(layer) for layer in _layers(func))


def default_name(func: object) -> str:
    """The name a handler gets when none is given: the function's (a partial's: its function's;
    a callable object's: its class's)."""
    for layer in _layers(func):
        if isinstance(layer, functools.partial):
            continue
        name = getattr(layer, "__name__", None)
        return name if isinstance(name, str) else type(layer).__name__
    return type(func).__name__


def refusal(name: str, func: object) -> str | None:
    """Why outbox cannot call ``func`` as the handler ``name`` correctly (one line), or None."""
    if not callable(func):
        return (
            f"handler {name!r}: {type(func).__name__} object is not callable; register a "
            f"function that takes the batch: def {name}(batch) or async def {name}(batch)"
        )
    for layer in _layers(func):
        if inspect.isasyncgenfunction(layer):
            return (
                f"handler {name!r} is an async generator function (async def with yield): "
                "calling it would never run its body; write async def without yield"
            )
        if inspect.isgeneratorfunction(layer):
            return (
                f"handler {name!r} is a generator function (it yields): calling it would "
                "never run its body; write a function without yield that returns nothing"
            )
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):  # no signature to read (some builtins): nothing to hold
        return None
    try:
        signature.bind(None)
    except TypeError:
        return (
            f"handler {name!r} cannot take the batch as its one argument (its signature is "
            f"{signature}); write it with one positional parameter: def {name}(batch)"
        )
    return None
