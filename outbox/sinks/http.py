"""The bulk HTTP sink: each group in one request (or a few, when the body would be too big),
with the group id as the idempotency key, and the answer mapped onto outbox's outcomes.

``pip install 'sqlalchemy-outbox[http]'`` (httpx). :class:`BulkHTTPSink` is sync (an
``httpx.Client``), :class:`AsyncBulkHTTPSink` async (an ``httpx.AsyncClient``); both take the
same arguments::

    sink = AsyncBulkHTTPSink(
        "https://api.example.com/v1/contacts/bulk",
        body=lambda events: {"contacts": [{"email": e.email} for e in events]},
        result=ErrorsById(items="errors", record_id=lambda e: e.email),
        headers={"Authorization": f"Bearer {token}"},
    )
    app.handler(ContactEvent, batch_size=1000, bisect=True)(sink)

What the API answers becomes (docs/sinks/http.md has the whole table):

- 2xx: the ``result`` mapper reads which records were taken (:class:`AllOrNothing`,
  :class:`StatusList`, :class:`ErrorsById`, or a function of your own); a record refused for
  good (4xx) is discarded with the API's reason, one it may take later (429, 5xx) is retried,
  a per-record 429 deferred by its ``retry_after``;
- 429, or 503 with ``Retry-After``: :class:`outbox.RetryAfter` (the handler waits, fleet-wide;
  ``Settings.min_retry_after`` is the floor);
- 400, 413, 422 for the whole call: :class:`outbox.DataError` (with ``bisect=True``, the group
  is split until the record the API cannot read is alone);
- a timeout, a connection error, a redirect, 401, 403, 404, another 4xx or a 5xx:
  :class:`outbox.DownstreamError`, which a circuit breaker counts.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import weakref
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import httpx

from outbox.batch import Batch
from outbox.exceptions import ConfigurationError, DownstreamError
from outbox.sinks._http_answers import (
    AllOrNothing,
    ErrorsById,
    ResultMapper,
    StatusList,
    read_answer,
    shown_url,
)
from outbox.sinks.base import AsyncSink, Rejection, Sink
from outbox.sinks.encoding import event_values, payload_bytes
from outbox.sinks.errors import unavailable
from outbox.sinks.secrets import Secrets, describe_error

__all__ = [
    "AllOrNothing",
    "AsyncBulkHTTPSink",
    "BulkHTTPSink",
    "ErrorsById",
    "ResultMapper",
    "StatusList",
    "records_body",
]

DEFAULT_TIMEOUT_SECONDS = 30.0
DEFAULT_IDEMPOTENCY_HEADER = "Idempotency-Key"
# Request headers that carry credentials, whoever set them (headers=, an httpx.Auth).
_CREDENTIAL_HEADERS = ("Authorization", "Proxy-Authorization", "Cookie")


# The loggers of httpx and httpcore that quote what an API answered (the status line, the
# headers) and the URL called: an application that logs them at INFO or DEBUG would log what
# the sinks mask everywhere else.
_CLIENT_LOGGERS = (
    "httpx",
    "httpcore.connection",
    "httpcore.http11",
    "httpcore.http2",
    "httpcore.proxy",
)


class _MaskedRecords(logging.Filter):
    """Masks the secrets of every live bulk HTTP sink out of the client's log records (only
    those logged: a logger's filters run once its level let the record through)."""

    def __init__(self) -> None:
        super().__init__()
        self.secrets: weakref.WeakSet[Secrets] = weakref.WeakSet()

    def filter(self, record: logging.LogRecord) -> bool:
        message = masked = record.getMessage()
        for secrets in list(self.secrets):
            masked = secrets.redact(masked)
        if masked != message:
            record.msg, record.args = masked, None
        return True


_MASKED_RECORDS = _MaskedRecords()


def _mask_client_logs(secrets: Secrets) -> None:
    """Mask ``secrets`` out of httpx's and httpcore's log records from now on."""
    _MASKED_RECORDS.secrets.add(secrets)
    for name in _CLIENT_LOGGERS:
        logger = logging.getLogger(name)
        if _MASKED_RECORDS not in logger.filters:
            logger.addFilter(_MASKED_RECORDS)


def records_body(events: Sequence[Any]) -> dict[str, Any]:
    """The default request body: ``{"records": [...]}``, each event's columns (its ``id``
    included, ``group_id`` not) as a JSON object."""
    return {"records": [event_values(event) for event in events]}


@dataclass(frozen=True, slots=True)
class _Part:
    """One request of a group: its events, its body, its idempotency key."""

    events: Sequence[Any]
    content: bytes
    key: str


@dataclass
class _Requests:
    """What the sync and the async sink share: building requests, reading answers."""

    url: str | Callable[[Sequence[Any]], str]
    body: Callable[[Sequence[Any]], Any]
    result: ResultMapper
    method: str
    idempotency_header: str | None
    headers: Mapping[str, str]
    timeout: httpx.Timeout
    allowed_hosts: frozenset[str]
    max_body_bytes: int | None
    content_type: str
    secrets: Secrets = field(default_factory=Secrets)

    def __post_init__(self) -> None:
        for value in self.headers.values():
            self.secrets.add_header(value)
        if isinstance(self.url, str):
            self.secrets.add_url(self.url)
        _mask_client_logs(self.secrets)

    def downstream(self) -> str:
        if callable(self.url):
            return f"bulk HTTP API at {', '.join(sorted(self.allowed_hosts))}"
        return f"bulk HTTP API at {shown_url(httpx.URL(self.url))}"

    def parts(self, batch: Batch[Any]) -> tuple[list[_Part], list[Rejection[Any]]]:
        """The group's requests, and its events too big to send alone (discarded)."""
        events = list(batch.events)
        parts: list[tuple[Sequence[Any], bytes]] = []
        too_big: list[Rejection[Any]] = []
        pending: list[Sequence[Any]] = [events]
        while pending:
            chunk = pending.pop(0)
            content = self.encode(chunk)
            if self.max_body_bytes is None or len(content) <= self.max_body_bytes:
                parts.append((chunk, content))
            elif len(chunk) == 1:
                too_big.append(
                    Rejection(
                        chunk[0],
                        f"its request body alone is {len(content)} bytes, more than "
                        f"max_body_bytes {self.max_body_bytes}",
                        retry=False,
                    )
                )
            else:  # halves, in order: the same group is always split the same way
                middle = len(chunk) // 2
                pending[:0] = [chunk[:middle], chunk[middle:]]
        key = str(batch.group_id)
        if len(parts) > 1:
            keyed = [
                _Part(chunk, content, f"{key}.{n}-of-{len(parts)}")
                for n, (chunk, content) in enumerate(parts, 1)
            ]
        else:
            keyed = [_Part(chunk, content, key) for chunk, content in parts]
        return keyed, too_big

    def encode(self, events: Sequence[Any]) -> bytes:
        return payload_bytes(self.body(events))

    def request(self, client: httpx.Client | httpx.AsyncClient, part: _Part) -> httpx.Request:
        url = httpx.URL(self.url(part.events) if callable(self.url) else self.url)
        if callable(self.url):  # what the function put in the URL, masked like a constant's
            self.secrets.add_url(str(url))
        if url.scheme not in ("http", "https") or url.host not in self.allowed_hosts:
            raise ConfigurationError(
                f"{shown_url(url)} is not an allowed host of this sink "
                f"(allowed_hosts: {', '.join(sorted(self.allowed_hosts))})"
            )
        headers = {"Content-Type": self.content_type}
        if self.idempotency_header:
            headers[self.idempotency_header] = part.key
        return client.build_request(
            self.method, url, content=part.content, headers=headers, timeout=self.timeout
        )

    def learn(self, request: httpx.Request) -> None:
        """Mask the credentials a request carries, whoever set them (``headers``, an
        ``httpx.Auth``), before it is sent: httpx logs the answer before the sink reads it."""
        for name in _CREDENTIAL_HEADERS:
            self.secrets.add_header(request.headers.get(name))

    async def alearn(self, request: httpx.Request) -> None:
        """:meth:`learn`, as the async client's hook."""
        self.learn(request)

    def read(self, response: httpx.Response, part: _Part) -> Sequence[Rejection[Any]]:
        """The answer's rejections, or what it says of the whole call, raised, with the
        sink's secrets masked (see :func:`read_answer`)."""
        self.learn(response.request)  # a client of the user's has no hook of the sink's
        return read_answer(response, part.events, self.result, self.secrets)

    def failed(self, error: httpx.HTTPError, part: _Part) -> DownstreamError:
        return DownstreamError(
            f"{self.downstream()}: {describe_error(error, self.secrets)} (request "
            f"{self.idempotency_header or 'key'} {part.key})"
        )

    def address(self) -> tuple[str, int] | None:
        """Host and port a constant URL connects to (checked at start)."""
        if callable(self.url):
            return None
        url = httpx.URL(self.url)
        return url.host, url.port or (443 if url.scheme == "https" else 80)


def _requests(
    url: str | Callable[[Sequence[Any]], str],
    body: Callable[[Sequence[Any]], Any],
    result: ResultMapper,
    method: str,
    idempotency_header: str | None,
    headers: Mapping[str, str] | None,
    timeout: float | httpx.Timeout,
    allowed_hosts: Collection[str] | None,
    max_body_bytes: int | None,
    content_type: str,
) -> _Requests:
    if isinstance(url, str):
        parsed = httpx.URL(url)
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise ConfigurationError(f"the sink's url must be http(s)://host/..., got {url!r:.80}")
        hosts = frozenset(allowed_hosts) if allowed_hosts is not None else {parsed.host}
    elif callable(url):
        if not allowed_hosts:
            raise ConfigurationError(
                "a sink whose url is a function needs allowed_hosts: the hosts it may call"
            )
        hosts = frozenset(allowed_hosts)
    else:
        raise ConfigurationError(f"url must be a str or a function, got {type(url).__name__}")
    if max_body_bytes is not None and not (
        isinstance(max_body_bytes, int)
        and not isinstance(max_body_bytes, bool)
        and max_body_bytes > 0
    ):
        raise ConfigurationError(
            f"max_body_bytes must be an int > 0 or None, got {max_body_bytes!r}"
        )
    if not isinstance(timeout, httpx.Timeout) and (
        isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0
    ):
        raise ConfigurationError(
            f"timeout must be seconds > 0 or an httpx.Timeout, got {timeout!r}"
        )
    return _Requests(
        url=url,
        body=body,
        result=result,
        method=method,
        idempotency_header=idempotency_header,
        headers=dict(headers or {}),
        timeout=timeout if isinstance(timeout, httpx.Timeout) else httpx.Timeout(timeout),
        allowed_hosts=frozenset(hosts),
        max_body_bytes=max_body_bytes,
        content_type=content_type,
    )


ClientT = TypeVar("ClientT", httpx.Client, httpx.AsyncClient)


class _BulkHTTP(Generic[ClientT]):
    """What :class:`BulkHTTPSink` and :class:`AsyncBulkHTTPSink` hold and say alike: the
    requests they build, the client they were given or make, how they name the API and their
    guarantee. The first of a sink's bases: it starts the other (``Sink`` or ``AsyncSink``)."""

    def __init__(
        self,
        requests: _Requests,
        auth: httpx.Auth | None,
        client: ClientT | None,
        check_at_start: bool,
    ) -> None:
        super().__init__()
        self._requests = requests
        self._auth = auth
        if isinstance(auth, httpx.BasicAuth):  # its header is known before any request
            request = next(auth.auth_flow(httpx.Request("POST", "http://localhost/")))
            requests.secrets.add_header(request.headers.get("Authorization"))
        self._given: ClientT | None = client
        self._client: ClientT | None = None
        self._check_at_start = check_at_start

    @property
    def downstream(self) -> str:
        """The API, in words (no secret)."""
        return self._requests.downstream()

    @property
    def secrets(self) -> Secrets:
        """What the sink masks out of every error and reason: its headers' values (whole and
        by their parts), the url's password and query values, what an ``httpx.Auth`` sent."""
        return self._requests.secrets

    @property
    def outbox_guarantee(self) -> str:
        """At least once, de-duplicated by the idempotency key."""
        header = self._requests.idempotency_header
        if header is None:
            return (
                "at least once: a group is posted again after a kill, a timeout or a 5xx, with "
                "no idempotency key (idempotency_header=None): the API must de-duplicate the "
                "records"
            )
        return (
            f"at least once: a group is posted again after a kill, a timeout or a 5xx with the "
            f"same {header} header (the group id; a split group's parts: the group id and the "
            f"part), by which the API de-duplicates"
        )


class BulkHTTPSink(_BulkHTTP[httpx.Client], Sink):
    """Posts each group to a bulk HTTP API with an ``httpx.Client`` (see the module's doc).

    ``url``: the endpoint, or a function of the group's events giving it (then
    ``allowed_hosts`` is required). ``body``: the events to the request body (JSON-able, or
    ``bytes``/``str`` sent as they are; default :func:`records_body`). ``result``: reads a 2xx
    answer (default :class:`AllOrNothing`). ``idempotency_header``: the header that carries the
    group id (None: none). ``headers``: sent with every request (``Authorization``...; their
    values never appear in a message). ``auth``: an ``httpx.Auth``. ``timeout``: seconds, or an
    ``httpx.Timeout``. ``allowed_hosts``: the only hosts requests may go to (default: the
    url's). ``max_body_bytes``: a body larger than this is split into halves, each its own
    request, until each fits; an event too big alone is discarded. ``client``: an
    ``httpx.Client`` of your own (its settings, but redirects are never followed).
    ``check_at_start``: connect to the url's host and port when a worker starts, so that an
    unreachable API stops it with one line.
    """

    def __init__(
        self,
        url: str | Callable[[Sequence[Any]], str],
        *,
        body: Callable[[Sequence[Any]], Any] = records_body,
        result: ResultMapper | None = None,
        method: str = "POST",
        idempotency_header: str | None = DEFAULT_IDEMPOTENCY_HEADER,
        headers: Mapping[str, str] | None = None,
        auth: httpx.Auth | None = None,
        timeout: float | httpx.Timeout = DEFAULT_TIMEOUT_SECONDS,
        allowed_hosts: Collection[str] | None = None,
        max_body_bytes: int | None = None,
        content_type: str = "application/json",
        client: httpx.Client | None = None,
        check_at_start: bool = True,
    ) -> None:
        requests = _requests(
            url, body, result or AllOrNothing(), method, idempotency_header, headers, timeout,
            allowed_hosts, max_body_bytes, content_type,
        )  # fmt: skip
        super().__init__(requests, auth, client, check_at_start)

    def connect(self) -> None:
        """Open the client; with ``check_at_start``, reach the url's host and port."""
        address = self._requests.address()
        if self._check_at_start and address is not None:
            try:
                socket.create_connection(address, timeout=self._requests.timeout.connect).close()
            except OSError as error:
                raise unavailable(self.downstream, error, self._requests.secrets) from error
        self._client = self._given or httpx.Client(
            headers=self._requests.headers,
            auth=self._auth,
            follow_redirects=False,
            event_hooks={"request": [self._requests.learn]},
        )

    def send(self, batch: Batch[Any]) -> Sequence[Rejection[Any]]:
        """Post the group (one request per part); the records the API did not take."""
        assert self._client is not None
        parts, rejections = self._requests.parts(batch)
        for part in parts:
            request = self._requests.request(self._client, part)
            try:
                response = self._client.send(request, auth=self._auth, follow_redirects=False)
            except httpx.HTTPError as error:
                raise self._requests.failed(error, part) from error
            rejections += self._requests.read(response, part)
        return rejections

    def close(self) -> None:
        """Close the client (not one given)."""
        if self._client is not None and self._given is None:
            self._client.close()
        self._client = None


class AsyncBulkHTTPSink(_BulkHTTP[httpx.AsyncClient], AsyncSink):
    """Posts each group to a bulk HTTP API with an ``httpx.AsyncClient``: the arguments of
    :class:`BulkHTTPSink` (``client``: an ``httpx.AsyncClient``). A group split into parts
    posts them one after another, in order."""

    def __init__(
        self,
        url: str | Callable[[Sequence[Any]], str],
        *,
        body: Callable[[Sequence[Any]], Any] = records_body,
        result: ResultMapper | None = None,
        method: str = "POST",
        idempotency_header: str | None = DEFAULT_IDEMPOTENCY_HEADER,
        headers: Mapping[str, str] | None = None,
        auth: httpx.Auth | None = None,
        timeout: float | httpx.Timeout = DEFAULT_TIMEOUT_SECONDS,
        allowed_hosts: Collection[str] | None = None,
        max_body_bytes: int | None = None,
        content_type: str = "application/json",
        client: httpx.AsyncClient | None = None,
        check_at_start: bool = True,
    ) -> None:
        requests = _requests(
            url, body, result or AllOrNothing(), method, idempotency_header, headers, timeout,
            allowed_hosts, max_body_bytes, content_type,
        )  # fmt: skip
        super().__init__(requests, auth, client, check_at_start)

    async def connect(self) -> None:
        """Open the client; with ``check_at_start``, reach the url's host and port."""
        address = self._requests.address()
        if self._check_at_start and address is not None:
            try:
                _, writer = await asyncio.wait_for(
                    asyncio.open_connection(*address), self._requests.timeout.connect
                )
                writer.close()
            except (OSError, TimeoutError) as error:
                raise unavailable(self.downstream, error, self._requests.secrets) from error
        self._client = self._given or httpx.AsyncClient(
            headers=self._requests.headers,
            auth=self._auth,
            follow_redirects=False,
            event_hooks={"request": [self._requests.alearn]},
        )

    async def send(self, batch: Batch[Any]) -> Sequence[Rejection[Any]]:
        """Post the group (one request per part); the records the API did not take."""
        assert self._client is not None
        parts, rejections = self._requests.parts(batch)
        for part in parts:
            request = self._requests.request(self._client, part)
            try:
                response = await self._client.send(request, auth=self._auth, follow_redirects=False)
            except httpx.HTTPError as error:
                raise self._requests.failed(error, part) from error
            rejections += self._requests.read(response, part)
        return rejections

    async def close(self) -> None:
        """Close the client (not one given)."""
        if self._client is not None and self._given is None:
            await self._client.aclose()
        self._client = None
