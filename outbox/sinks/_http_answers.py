"""What a bulk HTTP API's answer becomes: a whole-call status raised as outbox's outcome
(:class:`outbox.RetryAfter`, :class:`outbox.DataError`, :class:`outbox.DownstreamError`), a
2xx read by the sink's ``result`` mapper (:class:`AllOrNothing`, :class:`StatusList`,
:class:`ErrorsById`, or a function of the user's) into the records it did not take; the
sink's secrets masked from all of it. :mod:`outbox.sinks.http` exports the mappers.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import httpx

from outbox.exceptions import DataError, DownstreamError
from outbox.retry import DEFAULT_RETRY_AFTER_SECONDS, RetryAfter, wait_seconds
from outbox.sinks.base import Rejection
from outbox.sinks.secrets import Secrets

# How much of a refusing answer's body a failure's message quotes.
BODY_QUOTED = 200
# Whole-call answers that refuse what was sent (the events' fault): bisected with bisect=True.
_DATA_STATUSES = frozenset({400, 413, 422})
# Per-record answers that may succeed later.
_RETRY_STATUSES = frozenset({408, 409, 425, 429})


class ResultMapper(Protocol):
    """Reads a 2xx answer: the events of the request the API did not take, and why."""

    def __call__(
        self, response: httpx.Response, events: Sequence[Any]
    ) -> Sequence[Rejection[Any]]: ...


@dataclass(frozen=True, slots=True)
class AllOrNothing:
    """A 2xx answer means every record was taken (an API that refuses a call as a whole)."""

    def __call__(self, response: httpx.Response, events: Sequence[Any]) -> list[Rejection[Any]]:
        """No rejection: the call was taken whole."""
        return []


def record_rejection(
    event: Any, status: object, reason: object, retry_after: object
) -> Rejection[Any] | None:
    """What one record's status says: None when taken (2xx); retried when it may be taken later
    (408, 409, 425, 429 (deferred by ``retry_after``), 5xx); discarded otherwise (a 4xx). The
    reason is the API's (``status <n>`` when it gave none)."""
    if isinstance(status, bool) or not isinstance(status, int):
        raise DownstreamError(f"a record's status is not a number: {status!r:.80}")
    if 200 <= status < 300:
        return None
    why = str(reason) if reason not in (None, "") else f"status {status}"
    if status == 429:
        after = 0.0 if retry_after is None else wait_seconds(_when(retry_after), "retry_after")
        return Rejection(event, why, retry=True, after=after)
    if status in _RETRY_STATUSES or status >= 500:
        return Rejection(event, why, retry=True)
    return Rejection(event, why, retry=False)


def _when(value: object) -> float | str:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value
    # Text that cannot be read as a wait is logged: the secrets of the sink reading the
    # answer are masked from it.
    secrets = _READING.get()
    return str(value) if secrets is None else secrets.redact(str(value))


_READING: contextvars.ContextVar[Secrets | None] = contextvars.ContextVar(
    "outbox_http_reading", default=None
)
"""The secrets of the sink whose ``result`` mapper reads an answer now."""


def _json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        raise DownstreamError(
            f"{response.status_code} answer is not JSON: {response.text[:BODY_QUOTED]!r}"
        ) from None


def _items(document: Any, name: str) -> list[Any]:
    items = document.get(name) if isinstance(document, dict) else None
    if not isinstance(items, list):
        raise DownstreamError(f"the answer has no list {name!r}: {str(document)[:BODY_QUOTED]}")
    return items


@dataclass(frozen=True, slots=True)
class StatusList:
    """A 2xx answer lists one result per record, in the request's order:
    ``{"results": [{"status": 200}, {"status": 422, "reason": "no email"}, ...]}``.

    ``items``, ``status``, ``reason`` and ``retry_after`` name the list and each item's keys.
    """

    items: str = "results"
    status: str = "status"
    reason: str = "reason"
    retry_after: str = "retry_after"

    def __call__(self, response: httpx.Response, events: Sequence[Any]) -> list[Rejection[Any]]:
        """One rejection per result that is not a 2xx."""
        items = _items(_json(response), self.items)
        if len(items) != len(events):
            raise DownstreamError(
                f"the answer lists {len(items)} results for the {len(events)} records sent"
            )
        rejections = []
        for event, item in zip(events, items, strict=True):
            if not isinstance(item, dict):
                raise DownstreamError(f"a result is not an object: {item!r:.80}")
            rejection = record_rejection(
                event, item.get(self.status), item.get(self.reason), item.get(self.retry_after)
            )
            if rejection is not None:
                rejections.append(rejection)
        return rejections


def _event_id(event: Any) -> object:
    return event.id


@dataclass(frozen=True, slots=True)
class ErrorsById:
    """A 2xx answer lists only the records it refused, by an id the request gave them:
    ``{"errors": [{"id": "a1", "status": 422, "reason": "no email"}, ...]}``; the others were
    taken.

    ``record_id``: the id a record carries in the request, read from its event (default: the
    event's ``id``, as :func:`records_body` sends it), compared as text. ``status``: the key of
    each error's status; an error without one is refused for good (``default_status``, 422).
    """

    items: str = "errors"
    id: str = "id"
    record_id: Callable[[Any], object] = _event_id
    status: str = "status"
    reason: str = "reason"
    retry_after: str = "retry_after"
    default_status: int = 422

    def __call__(self, response: httpx.Response, events: Sequence[Any]) -> list[Rejection[Any]]:
        """One rejection per listed error."""
        by_id = {str(self.record_id(event)): event for event in events}
        rejections = []
        for item in _items(_json(response), self.items):
            if not isinstance(item, dict) or str(item.get(self.id)) not in by_id:
                raise DownstreamError(
                    f"the answer names a record the request did not carry: {item!r:.80}"
                )
            rejection = record_rejection(
                by_id[str(item[self.id])],
                item.get(self.status, self.default_status),
                item.get(self.reason),
                item.get(self.retry_after),
            )
            if rejection is not None:
                rejections.append(rejection)
        return rejections


def read_answer(
    response: httpx.Response, events: Sequence[Any], result: ResultMapper, secrets: Secrets
) -> Sequence[Rejection[Any]]:
    """The answer's rejections (``result``'s reading of a 2xx), or what it says of the whole
    call, raised; what they quote of the answer (its body, its reason phrase, a header, a
    record's reason) has ``secrets`` masked."""
    status = response.status_code
    where = shown_url(response.request.url)
    redact = secrets.redact
    if 200 <= status < 300:
        return _mapped(response, events, result, secrets)
    text = redact(f"{status} {response.reason_phrase} from {where}")
    retry_after = response.headers.get("Retry-After")
    if status == 429:
        raise RetryAfter(redact(retry_after or "") or DEFAULT_RETRY_AFTER_SECONDS, reason=text)
    if status == 503 and retry_after is not None:
        raise RetryAfter(redact(retry_after), reason=text)
    quoted = redact(" ".join(response.text[:BODY_QUOTED].split()))
    if status in _DATA_STATUSES:
        raise DataError(f"{text}: {quoted}" if quoted else text)
    if 300 <= status < 400:
        location = redact(response.headers.get("Location", "?"))
        raise DownstreamError(
            f"{text}: a redirect (to {location!r}), not followed: point the sink at the "
            "URL that answers"
        )
    raise DownstreamError(f"{text}: {quoted}" if quoted else text)


def _mapped(
    response: httpx.Response, events: Sequence[Any], result: ResultMapper, secrets: Secrets
) -> list[Rejection[Any]]:
    """What the ``result`` mapper reads of a 2xx answer, with the reasons it gives and what
    it raises masked (it may quote the answer)."""
    reading = _READING.set(secrets)
    try:
        with secrets.masking():
            rejections = result(response, events)
    finally:
        _READING.reset(reading)
    return [
        replace(r, reason=secrets.redact(r.reason)) if secrets.shows(r.reason) else r
        for r in rejections
    ]


def shown_url(url: httpx.URL) -> str:
    """A URL as messages show it: no user, password or query (they may hold secrets)."""
    port = f":{url.port}" if url.port else ""
    return f"{url.scheme}://{url.host}{port}{url.path}"
