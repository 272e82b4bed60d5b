"""Redis Streams: each group is appended to its streams with one pipelined round trip of
``XADD`` commands, one per event in id order (redis-py, ``pip install 'sqlalchemy-outbox[redis]'``).

Each message has the fields ``id`` (the message id, the same on every attempt: what a
consumer de-duplicates by), ``key`` (the ordering key's value, when there is one) and
``payload`` (the body). An event is done only when Redis answered its ``XADD`` with the id it
stored it under; one refused (``WRONGTYPE``, out of memory, a missing stream under
``create_stream=False``) is retried, the rest of the group is done. A pipeline that fails as a
whole (the connection lost, a timeout) fails the attempt as a
:class:`outbox.DownstreamError`, which a circuit breaker counts.

Redis has no producer de-duplication before 8.6, and this sink does not use it: the guarantee
is at least once, and docs/sinks/redis.md says what a server with an idempotent-producer window
would change.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Generic, Protocol, TypeVar
from urllib.parse import unquote, urlsplit

import redis
import redis.asyncio
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.retry import Retry

from outbox.app import Handler, Outbox
from outbox.batch import Batch
from outbox.exceptions import ConfigurationError, DownstreamError, DownstreamUnavailableError
from outbox.sinks.base import AsyncSink, Rejection, Sink
from outbox.sinks.encoding import (
    RowPath,
    json_payload,
    message_id,
    ordering_key,
    payload_bytes,
    row_messages,
)
from outbox.sinks.errors import downstream_failed, unavailable
from outbox.sinks.options import PerEvent, per_event
from outbox.sinks.secrets import Secrets, describe_error

DEFAULT_URL = "redis://127.0.0.1:6379/0"

TIMEOUT_SECONDS = 5.0
"""How long a connection attempt, and a wait for the replies of one pipeline, may take before
the attempt fails (a URL's ``socket_timeout`` and ``socket_connect_timeout`` override it)."""

RECONNECTS = 1
"""Times redis-py reconnects and sends a pipeline again, at once, when its connection broke:
once, for a pooled connection the server closed while it was idle; an outage is left to
outbox's retries and circuit breaker rather than waited out here."""

GUARANTEE = (
    "at least once: a message is re-sent only for groups in flight at a kill or a lost reply; "
    "consumers de-duplicate by the `id` field"
)

ID_FIELD = "id"
KEY_FIELD = "key"
PAYLOAD_FIELD = "payload"


class _Queue(Protocol):
    """A redis-py pipeline, sync or async, as the core fills it."""

    def execute_command(self, *args: Any, **options: Any) -> Any:
        """Queue one command."""


class _Core:
    """What the sync and the async sink share: the options, the mapping of a group onto
    ``XADD`` commands and of Redis's replies onto outbox's outcomes. It does no I/O."""

    def __init__(
        self,
        owner: str,
        url: str,
        *,
        stream: PerEvent[str],
        payload: Callable[[Any], bytes | str | Any],
        message_id: Callable[[Any], str],
        key: Callable[[Any], str | None] | None,
        maxlen: int | None,
        approximate: bool,
        create_stream: bool,
        client: Any,
    ) -> None:
        if not isinstance(url, str) or not url:
            raise ConfigurationError(f"{owner}.url must be a redis:// URL, got {url!r}")
        if not (callable(stream) or (isinstance(stream, str) and stream)):
            raise ConfigurationError(
                f"{owner}.stream must be a stream name or a function of the event, got {stream!r}"
            )
        for name, function in (("payload", payload), ("message_id", message_id)):
            if not callable(function):
                raise ConfigurationError(f"{owner}.{name} must be a function of the event")
        if key is not None and not callable(key):
            raise ConfigurationError(f"{owner}.key must be a function of the event, or None")
        if maxlen is not None and (
            isinstance(maxlen, bool) or not isinstance(maxlen, int) or maxlen < 1
        ):
            raise ConfigurationError(f"{owner}.maxlen must be a whole number >= 1, got {maxlen!r}")
        self.url = url
        self.stream = stream
        self.payload = payload
        self.message_id = message_id
        self.key = key
        self.keys: dict[str, Callable[[Any], str | None] | None] = {}
        """The message key of each handler the sink is registered as (its ordering key),
        learnt when a worker starts it."""
        self.row_paths: dict[str, RowPath | None] = {}
        self.given = client
        self.secrets = Secrets()
        self.secrets.add_quoted(urlsplit(url).password)
        if client is not None:
            self.secrets.add(_client_option(client, "password"))
        self.downstream = f"Redis at {_public_url(url if client is None else _client_url(client))}"
        self.create_stream = create_stream
        self.server_version: str | None = None
        # XADD's options, spelt once: they are the same for every message.
        options: list[Any] = [] if create_stream else ["NOMKSTREAM"]
        if maxlen is not None:
            options += ["MAXLEN", "~" if approximate else "=", maxlen]
        self._options = tuple(options)

    def client_options(self) -> dict[str, Any]:
        """The options of a client the sink makes from its URL (the URL's own win)."""
        return {
            "socket_timeout": TIMEOUT_SECONDS,
            "socket_connect_timeout": TIMEOUT_SECONDS,
        }

    def queue_start(self, pipe: _Queue) -> None:
        """Queue the checks made on connecting, one round trip: PING (a wrong password or an
        unreachable server fails here), the server's version, a constant stream's type."""
        pipe.execute_command("PING")
        pipe.execute_command("INFO", "server")
        if not callable(self.stream):
            pipe.execute_command("TYPE", self.stream)

    def started(self, replies: Sequence[Any]) -> None:
        """Read the checks made on connecting; raise what stops a worker at start."""
        ping, info, *kind = replies
        if isinstance(ping, Exception):
            raise self.unavailable(ping)
        # The version is for the docs' and the operator's sake: a user without the right to
        # INFO can still send.
        if isinstance(info, dict):
            self.server_version = str(info.get("redis_version"))
        if not kind or callable(self.stream):
            return
        if isinstance(kind[0], Exception):
            raise self.unavailable(kind[0])
        held = _text(kind[0])
        if held not in ("stream", "none"):
            raise ConfigurationError(
                f"{self.downstream}: the key {self.stream!r} holds a {held}, not a stream "
                f"(every XADD to it would fail with WRONGTYPE): name another stream"
            )
        if held == "none" and not self.create_stream:
            raise ConfigurationError(
                f"{self.downstream}: the stream {self.stream!r} does not exist and "
                f"create_stream=False: create it (XGROUP CREATE ... MKSTREAM), or let the sink "
                f"create it"
            )

    def unavailable(self, error: BaseException) -> DownstreamUnavailableError:
        """The one line a failed connection raises, secrets masked."""
        return unavailable(self.downstream, error, self.secrets)

    def learn(self, handler: Handler[Any]) -> None:
        """Take the handler's ordering key as the message key, unless ``key`` was given; and
        see whether its groups' messages can be read from their rows."""
        self.keys[handler.name] = self.key if self.key is not None else ordering_key(handler)
        # A stream given as a function is given the event: no row path.
        self.row_paths[handler.name] = (
            None
            if callable(self.stream)
            else row_messages(
                handler, payload=self.payload, message_id=self.message_id, key=self.key
            )
        )

    def messages(self, batch: Batch[Any]) -> list[tuple[Any, ...]]:
        """The group's ``XADD`` commands, in id order."""
        path = self.row_paths.get(batch.handler)
        read = None if path is None else path.messages(batch)
        if read is not None:
            stream = str(self.stream)
            return [self._command(stream, *message) for message in read]
        key = self.keys.get(batch.handler, self.key)
        commands = []
        for event in batch.events:
            commands.append(
                self._command(
                    per_event(self.stream, event),
                    self.message_id(event),
                    None if key is None else key(event),
                    payload_bytes(self.payload(event)),
                )
            )
        return commands

    def _command(self, stream: str, id_: str, key: str | None, payload: bytes) -> tuple[Any, ...]:
        if key is None:
            return ("XADD", stream, *self._options, "*", ID_FIELD, id_, PAYLOAD_FIELD, payload)
        fields = (ID_FIELD, id_, KEY_FIELD, key, PAYLOAD_FIELD, payload)
        return ("XADD", stream, *self._options, "*", *fields)

    def queue(self, pipe: _Queue, commands: Sequence[tuple[Any, ...]]) -> None:
        """Queue every command on ``pipe``."""
        for command in commands:
            pipe.execute_command(*command)

    def rejections(
        self, batch: Batch[Any], commands: Sequence[tuple[Any, ...]], replies: Sequence[Any]
    ) -> list[Rejection[Any]]:
        """The events Redis did not store: each reply is the id an ``XADD`` stored its message
        under, a refusal (an exception), or nothing (``NOMKSTREAM`` on a missing stream)."""
        rejected: list[Rejection[Any]] = []
        for index, (command, reply) in enumerate(zip(commands, replies, strict=True)):
            stream = command[1]
            if isinstance(reply, Exception):
                reason = f"XADD to {stream!r}: {describe_error(reply, self.secrets)}"
            elif reply is None:
                reason = f"the stream {stream!r} does not exist (create_stream=False)"
            else:
                continue
            rejected.append(Rejection(batch.events[index], reason, retry=True))
        return rejected

    def failed(self, error: BaseException) -> DownstreamError:
        """The error a pipeline that failed as a whole raises: no reply was read for any of
        its messages, so none is done (some may be stored: they are sent again)."""
        return downstream_failed(self.downstream, error, self.secrets)


ClientT = TypeVar("ClientT", redis.Redis, redis.asyncio.Redis)


class _StreamSink(Generic[ClientT]):
    """What :class:`RedisStreamSink` and :class:`AsyncRedisStreamSink` hold and say alike:
    the core, the client, how they name the server and their guarantee. The first of a sink's
    bases: it starts the other (``Sink`` or ``AsyncSink``)."""

    def __init__(self, core: _Core) -> None:
        super().__init__()
        self._core = core
        self._client: ClientT | None = None

    @property
    def downstream(self) -> str:
        """``Redis at redis://host:port/db``, without the password."""
        return self._core.downstream

    @property
    def outbox_guarantee(self) -> str:
        """At least once; consumers de-duplicate by the ``id`` field."""
        return GUARANTEE

    @property
    def secrets(self) -> Secrets:
        """What the sink masks out of every error: the URL's or the client's password."""
        return self._core.secrets

    @property
    def server_version(self) -> str | None:
        """The Redis server's version, read when the sink connected; None before."""
        return self._core.server_version


class RedisStreamSink(_StreamSink[redis.Redis], Sink):
    """Append each group to Redis streams with one pipelined round trip, sync (redis-py's
    ``redis.Redis``).

    ``url``: the server (``redis://[[user]:password@]host:port/db``, ``rediss://`` for TLS).
    ``stream``: the stream's name, or a function of the event that returns it (one buffer feeds
    many streams). ``payload``: the message body, a function of the event (default: its columns
    as JSON); bytes and text are sent as they are, anything else as JSON. ``message_id``: the
    ``id`` field, the same on every attempt (default ``<buffer table>-<event id>``). ``key``:
    the ``key`` field, a function of the event; by default the value of the handler's
    ``ordering_key`` column, and no ``key`` field without one. ``maxlen``: trim each stream to
    about (``approximate=True``, ``MAXLEN ~``) or exactly this many messages on every
    ``XADD``. ``create_stream=False``: never create a stream (``XADD NOMKSTREAM``); a missing
    constant stream stops the worker at start. ``client``: a ``redis.Redis`` of your own to use
    instead of one made from ``url`` (the sink does not close it).
    """

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        stream: PerEvent[str],
        payload: Callable[[Any], bytes | str | Any] = json_payload,
        message_id: Callable[[Any], str] = message_id,
        key: Callable[[Any], str | None] | None = None,
        maxlen: int | None = None,
        approximate: bool = True,
        create_stream: bool = True,
        client: redis.Redis | None = None,
    ) -> None:
        core = _Core(
            type(self).__name__, url, stream=stream, payload=payload, message_id=message_id,
            key=key, maxlen=maxlen, approximate=approximate, create_stream=create_stream,
            client=client,
        )  # fmt: skip
        super().__init__(core)

    def connect(self) -> None:
        """Make the client and check the server: it answers, the password is right, a
        constant stream is a stream (and exists, under ``create_stream=False``)."""
        client = self._core.given
        if client is None:
            client = redis.Redis.from_url(
                self._core.url,
                retry=Retry(NoBackoff(), RECONNECTS),
                **self._core.client_options(),
            )
        pipe = client.pipeline(transaction=False)
        self._core.queue_start(pipe)
        try:
            replies = pipe.execute(raise_on_error=False)
        except (RedisError, OSError) as error:
            self._close(client)
            raise self._core.unavailable(error) from error
        try:
            self._core.started(replies)
        except (DownstreamUnavailableError, ConfigurationError):
            self._close(client)
            raise
        self._client = client

    def check(self, app: Outbox, handler: Handler[Any]) -> None:
        """Learn the handler's ordering key, the message key by default."""
        self._core.learn(handler)

    def send(self, batch: Batch[Any]) -> Sequence[Rejection[Any]]:
        """Send the group in one pipeline; return the events Redis did not store."""
        commands = self._core.messages(batch)
        if not commands:
            return []
        assert self._client is not None, "send() before connect()"
        pipe = self._client.pipeline(transaction=False)
        self._core.queue(pipe, commands)
        try:
            replies = pipe.execute(raise_on_error=False)
        except (RedisError, OSError) as error:
            raise self._core.failed(error) from error
        return self._core.rejections(batch, commands, replies)

    def close(self) -> None:
        """Close the client the sink made (not one it was given)."""
        client, self._client = self._client, None
        if client is not None:
            self._close(client)

    def _close(self, client: redis.Redis) -> None:
        if client is not self._core.given:
            client.close()


class AsyncRedisStreamSink(_StreamSink[redis.asyncio.Redis], AsyncSink):
    """Append each group to Redis streams with one pipelined round trip, async
    (``redis.asyncio.Redis``). The same options as :class:`RedisStreamSink`; ``client``, if
    given, is a ``redis.asyncio.Redis``."""

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        stream: PerEvent[str],
        payload: Callable[[Any], bytes | str | Any] = json_payload,
        message_id: Callable[[Any], str] = message_id,
        key: Callable[[Any], str | None] | None = None,
        maxlen: int | None = None,
        approximate: bool = True,
        create_stream: bool = True,
        client: redis.asyncio.Redis | None = None,
    ) -> None:
        core = _Core(
            type(self).__name__, url, stream=stream, payload=payload, message_id=message_id,
            key=key, maxlen=maxlen, approximate=approximate, create_stream=create_stream,
            client=client,
        )  # fmt: skip
        super().__init__(core)

    async def connect(self) -> None:
        """Make the client and check the server (see :meth:`RedisStreamSink.connect`)."""
        client = self._core.given
        if client is None:
            client = redis.asyncio.Redis.from_url(
                self._core.url,
                retry=AsyncRetry(NoBackoff(), RECONNECTS),
                **self._core.client_options(),
            )
        pipe = client.pipeline(transaction=False)
        self._core.queue_start(pipe)
        try:
            replies = await pipe.execute(raise_on_error=False)
        except (RedisError, OSError) as error:
            await self._close(client)
            raise self._core.unavailable(error) from error
        try:
            self._core.started(replies)
        except (DownstreamUnavailableError, ConfigurationError):
            await self._close(client)
            raise
        self._client = client

    async def check(self, app: Outbox, handler: Handler[Any]) -> None:
        """Learn the handler's ordering key, the message key by default."""
        self._core.learn(handler)

    async def send(self, batch: Batch[Any]) -> Sequence[Rejection[Any]]:
        """Send the group in one pipeline; return the events Redis did not store."""
        commands = self._core.messages(batch)
        if not commands:
            return []
        assert self._client is not None, "send() before connect()"
        pipe = self._client.pipeline(transaction=False)
        self._core.queue(pipe, commands)
        try:
            replies = await pipe.execute(raise_on_error=False)
        except (RedisError, OSError) as error:
            raise self._core.failed(error) from error
        return self._core.rejections(batch, commands, replies)

    async def close(self) -> None:
        """Close the client the sink made (not one it was given)."""
        client, self._client = self._client, None
        if client is not None:
            await self._close(client)

    async def _close(self, client: redis.asyncio.Redis) -> None:
        if client is not self._core.given:
            await client.aclose()


def _text(reply: Any) -> str:
    return reply.decode() if isinstance(reply, bytes) else str(reply)


def _public_url(url: str) -> str:
    """``url`` without its password or query (which may carry one)."""
    parts = urlsplit(url)
    if parts.hostname is None:
        return f"{parts.scheme}://{parts.path}"
    user = f"{unquote(parts.username)}@" if parts.username else ""
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    port = f":{parts.port}" if parts.port is not None else ""
    return f"{parts.scheme}://{user}{host}{port}{parts.path}"


def _client_option(client: Any, name: str) -> Any:
    kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", {})
    return kwargs.get(name)


def _client_url(client: Any) -> str:
    """A URL for a client given instead of one (to name the downstream)."""
    path = _client_option(client, "path")
    if path:
        return f"unix://{path}"
    host = _client_option(client, "host") or "localhost"
    port = _client_option(client, "port") or 6379
    db = _client_option(client, "db") or 0
    return f"redis://{host}:{port}/{db}"
