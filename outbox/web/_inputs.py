"""What the pages and their forms take from a request, shared by reads and writes: a group's
id, a selection's filters; and :func:`attempt`, which asks the operations layer with them and
turns input outbox refuses into a message for the page rather than an error page."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

from starlette.datastructures import FormData, ImmutableMultiDict
from starlette.exceptions import HTTPException

from outbox._core.checks import path_step, text_problem
from outbox.ops.selection import Selection
from outbox.schema import GroupStatus
from outbox.web._console import Console, call
from outbox.web.api import selection_of

FILTERS = ("handler", "status", "older_than", "error", "key", "payload")
"""The query parameters (and form fields) of a selection, as ``outbox groups`` names them."""
DEAD_STATUSES = (GroupStatus.DEAD, GroupStatus.HELD)
"""The statuses the dead letters page lists, and the only ones a write from it selects."""


def filters_of(given: Any) -> list[tuple[str, str]]:
    """The selection's parameters of a query string or a form, blanks left out."""
    return [
        (name, value.strip())
        for name, value in given.multi_items()
        if name in FILTERS and isinstance(value, str) and value.strip()
    ]


def selection_of_filters(
    console: Console, pairs: list[tuple[str, str]], statuses: Iterable[str] | None = None
) -> Selection:
    """A selection of ``pairs`` (``statuses``: the only ones allowed, all when none given)."""
    if statuses is not None:
        allowed = [s.value if isinstance(s, GroupStatus) else s for s in statuses]
        given = [v for k, v in pairs if k == "status"]
        chosen = [s for s in given if s in allowed] or allowed
        pairs = [(k, v) for k, v in pairs if k != "status"] + [("status", s) for s in chosen]
    return selection_of(console, ImmutableMultiDict(pairs), many=True)


def checked_form(form: FormData) -> FormData:
    """``form``, when every field's name and text is text the databases store: a 400 naming
    the field otherwise (a NUL character, or a lone surrogate a multipart part's charset can
    decode to), before anything is done with it."""
    for name, value in form.multi_items():
        problem = text_problem(name) or (text_problem(value) if isinstance(value, str) else None)
        if problem is not None:
            raise HTTPException(400, f"{path_step(name)}: {problem}")
    return form


def group_id_of(text: str) -> uuid.UUID:
    """The group id of a path or a form; 404 when ``text`` is not one."""
    try:
        return uuid.UUID(text)
    except ValueError as error:
        raise HTTPException(404, f"no group {text!r}: not a group id") from error


async def attempt(work: Any, *args: Any, **kwargs: Any) -> tuple[Any, str | None]:
    """``call(work, ...)``, with input outbox refuses (400, 409) as a message rather than an
    error page: the operator is sent back to the form, told what was wrong."""
    try:
        return await call(work, *args, **kwargs), None
    except HTTPException as error:
        if error.status_code in (400, 409):
            return None, str(error.detail)
        raise
