"""Checks of values given to outbox: numbers that are numbers, whole numbers that are whole,
waits short enough for every database to store their end, and text (and JSON) that every
database stores."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from typing import Any

MAX_WAIT_SECONDS = 366 * 86_400.0
"""The longest outbox waits for anything: a pause, a deferral, a backoff, a circuit breaker's
probe. Longer is a typo or a broken header (past the year 9999, no database stores the time)."""


def is_number(value: object) -> bool:
    """A finite int or float (not a bool, not a numeric string)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int past a float's range
        return False


def is_whole(value: object) -> bool:
    """An int (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool)


_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
MAX_JSON_DEPTH = 31
"""The deepest JSON value outbox takes (arrays and objects within each other): MariaDB's
``JSON_VALID`` refuses 32 levels, and none of outbox's own fields nests past a few."""


def text_problem(text: str) -> str | None:
    """Why no database stores ``text`` as given, or None: a lone surrogate (valid in JSON's
    ``\\ud800``, but not Unicode text: no encoding to UTF-8 exists) or a NUL character
    (PostgreSQL's text and JSONB refuse it)."""
    found = _UNSTORABLE.search(text)
    if found is None:
        return None
    if found.group() == "\x00":
        return "a NUL character (\\u0000) is not stored by every database"
    return f"a lone surrogate ({ascii(found.group())[1:-1]}) is not text"


def quoted(name: str, limit: int = 80) -> str:
    """``name`` as a message may quote it: ``repr``'s quotes and escapes (a lone surrogate
    written as it is would make the message itself unencodable), cut at ``limit``
    characters."""
    text = repr(name)
    return text if len(text) <= limit else text[: limit - 4] + "..." + text[-1]


def path_step(name: str) -> str:
    """An object's key as a step of a path in a message: escaped as :func:`quoted` escapes."""
    return name if name.isprintable() and len(name) <= 80 else quoted(name)[1:-1]


def json_problem(value: Any, path: str = "", max_depth: int = MAX_JSON_DEPTH) -> str | None:
    """What is wrong with a JSON value (as ``json.loads`` makes it) for outbox to store it,
    naming where, or None: text :func:`text_problem` refuses (in keys too), a number past a
    double's range, arrays and objects nested deeper than ``max_depth``. Read without
    recursion, so that no depth of nesting costs the stack."""
    for where, item, depth in _walk(value, path):
        if depth > max_depth and isinstance(item, dict | list):
            return f"{where or 'value'}: nested deeper than {max_depth} levels"
        problem = None
        if isinstance(item, str):
            problem = text_problem(item)
        elif isinstance(item, float) and not math.isfinite(item):
            problem = "a number past a double's range (or NaN) is not JSON outbox stores"
        elif isinstance(item, int) and not isinstance(item, bool) and not is_number(item):
            problem = "a number past a double's range is not JSON outbox stores"
        if problem is not None:
            return f"{where or 'value'}: {problem}"
    return None


def _walk(value: Any, path: str) -> Iterator[tuple[str, Any, int]]:
    """Each value within ``value`` (keys of objects as values of their own), with its path and
    its depth (1: ``value`` itself), outermost first."""
    stack = [(path, value, 1)]
    while stack:
        where, item, depth = stack.pop()
        yield where, item, depth
        if isinstance(item, dict):
            for key, inner in reversed(item.items()):
                named = f"{where}.{path_step(key)}" if where else path_step(key)
                stack.append((named, inner, depth + 1))
                stack.append((named, key, depth))
        elif isinstance(item, list):
            for position in reversed(range(len(item))):
                stack.append((f"{where}[{position}]", item[position], depth + 1))
