"""NATS JetStream: each event of a group published as one message, acknowledged by the stream
(nats-py, ``pip install 'sqlalchemy-outbox[nats]'``).

A group is published pipelined on one connection: every message is written in id order, each
with a reply subject of its own, then the acknowledgements (``PubAck``) are awaited together,
so that a group of 1,000 costs one wait for the server, not 1,000 request/reply round trips.
The server stores one connection's messages in the order it receives them, so the stream
holds a key's events in id order (outbox sends one group of an ordering key at a time).

Each message carries ``Nats-Msg-Id`` (the message id, the same on every attempt): JetStream
drops a message whose id it stored within the stream's ``duplicate_window``, and answers it
as a duplicate, which is success. When a worker starts, the sink reads the window and refuses,
in one line, a handler whose events may be re-sent later than the window would catch (every
retry wait, and the lease and timeout of each attempt before the last:
:func:`outbox.sinks.dedup_window.resend_horizon`). Within the
window no duplicate is stored; past it, consumers de-duplicate by ``Nats-Msg-Id``.

An event is done only once the stream acknowledged it; one refused (no stream on its subject,
a stream limit) or not acknowledged in time is retried alone. A connection lost before any
acknowledgement fails the attempt as a :class:`outbox.DownstreamError`, which a circuit
breaker counts; the next group connects again.

    from outbox.sinks.nats import AsyncJetStreamSink, JetStreamSink

    orders = JetStreamSink("nats://nats:4222", subject=lambda e: f"orders.{e.region}",
                           stream="ORDERS", connect_options={"token": token})
    app.handler(OrderEvent, batch_size=1000, ordering_key="customer_id")(orders)

See docs/sinks/nats.md.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import nats.aio.client
import nats.aio.msg
import nats.errors
import nats.js
import nats.js.api
import nats.js.errors

from outbox.app import Outbox
from outbox.batch import Batch
from outbox.exceptions import ConfigurationError
from outbox.handler import Handler
from outbox.sinks._nats_connection import NO_RESPONDERS, Acks, Connection
from outbox.sinks.base import AsyncSink, Rejection, blocking_sink
from outbox.sinks.dedup_window import check_dedup_window, resend_horizon
from outbox.sinks.encoding import (
    Message,
    RowPath,
    json_payload,
    message_id,
    ordering_key,
    payload_bytes,
    row_messages,
)
from outbox.sinks.errors import downstream_failed, not_a_message, unavailable
from outbox.sinks.options import PerEvent, check_per_event, per_event
from outbox.sinks.secrets import Secrets, describe_error

DEFAULT_SERVERS = "nats://127.0.0.1:4222"
ACK_TIMEOUT_SECONDS = 10.0
"""How long a group waits for its acknowledgements once every message is written."""
CONNECT_TIMEOUT_SECONDS = 5.0
"""How long one attempt to connect to a server, and each JetStream API request at connect
(the stream's look-up), may take."""
RECONNECT_WAIT_SECONDS = 0.5
"""The pause before the second (and last) attempt on each server when connecting."""

MSG_ID_HEADER = "Nats-Msg-Id"
"""The header JetStream de-duplicates by, within the stream's ``duplicate_window``."""
KEY_HEADER = "Outbox-Key"
"""The header that carries each message's key (the handler's ordering key by default)."""
EXPECTED_STREAM_HEADER = "Nats-Expected-Stream"
"""The header that makes JetStream refuse a message whose subject another stream listens on,
rather than store it outside the window the sink checked."""

LOWER_HORIZON = "lower RetryPolicy.max_attempts or max_delay, or the lease"

_SCHEMES = {"nats": 4222, "tls": 4222, "ws": 80, "wss": 443}
# Options of nats.connect that hold a secret: masked out of every message.
_SECRET_OPTIONS = ("password", "token", "nkeys_seed_str")


class AsyncJetStreamSink(AsyncSink):
    """Publishes each event of a group to NATS JetStream, and waits for the stream's
    acknowledgements.

    ``servers``: the server, or servers, to connect to (``nats://host:4222``; credentials in
    the URL never show in an error or a log). ``subject``: the subject, given once or as a
    function of the event (its columns), so that one buffer feeds many subjects; a function
    needs ``stream``. ``stream``: the stream the messages must land in; it must exist
    (checked when the worker starts). Without it, the stream that listens on ``subject``.
    ``payload``: the body, from the event: bytes as they are, text in UTF-8, anything else as
    JSON (default: the event's columns as JSON). ``message_id``: the ``Nats-Msg-Id`` header,
    the same on every attempt (default ``<table>-<id>``), what JetStream drops a re-sent
    message by. ``headers``: more headers, from the event. ``key``: the ``Outbox-Key`` header;
    by default the value of the handler's ``ordering_key`` column, learnt when the worker
    starts (no header without one). ``ack_timeout``: seconds a group waits for its
    acknowledgements; a message not acknowledged by then is retried. ``connect_options``:
    passed to ``nats.connect`` (``user``, ``password``, ``token``, ``user_credentials``,
    ``tls``, ``name``, ``connect_timeout``...); their secrets never show either.

    The client does not reconnect by itself: a group whose connection is lost fails (or
    retries what was not acknowledged), and the next group connects again, so that an outage
    reaches outbox's retries and circuit breaker instead of a buffer in the client.
    """

    def __init__(
        self,
        servers: str | Sequence[str] = DEFAULT_SERVERS,
        *,
        subject: PerEvent[str],
        stream: str | None = None,
        payload: Callable[[Any], bytes | str | Any] = json_payload,
        message_id: Callable[[Any], str] = message_id,
        headers: Callable[[Any], Mapping[str, str]] | None = None,
        key: Callable[[Any], str | None] | None = None,
        ack_timeout: float = ACK_TIMEOUT_SECONDS,
        connect_options: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.servers = [servers] if isinstance(servers, str) else list(servers)
        if not self.servers:
            raise ConfigurationError("servers: expected at least one nats:// URL, got none")
        self._secrets = Secrets()
        shown = [self._server(url) for url in self.servers]
        check_per_event("subject", subject)
        if isinstance(subject, str) and not _is_subject(subject):
            raise ConfigurationError(
                f"subject: expected a subject to publish to (no spaces, no wildcards), "
                f"got {subject!r}"
            )
        if callable(subject) and stream is None:
            raise ConfigurationError(
                "subject: a function of the event needs stream= (the JetStream stream its "
                "subjects belong to): give stream= the stream's name"
            )
        if stream is not None and not _is_stream_name(stream):
            raise ConfigurationError(
                f"stream: expected a JetStream stream name (no spaces, dots or wildcards), "
                f"got {stream!r}"
            )
        if not ack_timeout > 0:
            raise ConfigurationError(f"ack_timeout: expected seconds > 0, got {ack_timeout!r}")
        self.subject = subject
        self.stream = stream
        self.payload = payload
        self.message_id = message_id
        self.headers = headers
        self.key = key
        self.ack_timeout = ack_timeout
        self.connect_options = dict(connect_options or {})
        for name in _SECRET_OPTIONS:
            value = self.connect_options.get(name)
            if isinstance(value, str | bytes):
                self._secrets.add(value)
        self._downstream = f"NATS JetStream at {', '.join(shown)}"
        self._stream_name: str | None = stream
        self._window: float | None = None
        self._horizon: float | None = None
        # The key function of each handler the sink is registered as, by handler name.
        self._keys: dict[str, Callable[[Any], str | None] | None] = {}
        # How each handler's default messages are read from its groups' rows, by handler name.
        self._rows: dict[str, RowPath | None] = {}
        self._connection: Connection | None = None
        self._opening: asyncio.Lock | None = None

    def _server(self, url: str) -> str:
        """``url`` without credentials (those are masked from now on), checked."""
        parts = urlsplit(url if "://" in url else f"nats://{url}")
        if parts.scheme not in _SCHEMES or not parts.hostname:
            raise ConfigurationError(
                f"servers: expected nats://[user:password@]host[:port] (or tls://, ws://, "
                f"wss://), got a URL with scheme {parts.scheme!r}"
            )
        if parts.password:
            self._secrets.add_quoted(parts.password)
        elif parts.username:  # nats://token@host: the user part is a token
            self._secrets.add_quoted(parts.username)
        return f"{parts.scheme}://{parts.hostname}:{parts.port or _SCHEMES[parts.scheme]}"

    @property
    def downstream(self) -> str:
        """``NATS JetStream at nats://host:4222``: the servers, without credentials."""
        return self._downstream

    @property
    def secrets(self) -> Secrets:
        """What the sink masks out of every error: the servers' credentials and the secret
        connect options."""
        return self._secrets

    @property
    def stream_name(self) -> str | None:
        """The stream the messages land in: ``stream``, or the one found listening on
        ``subject`` when the sink connected; None before."""
        return self._stream_name

    @property
    def duplicate_window(self) -> float | None:
        """The stream's ``duplicate_window`` in seconds, read when the sink connected."""
        return self._window

    @property
    def outbox_guarantee(self) -> str:
        """No duplicates stored within the stream's duplicate window, checked at worker
        start against the handler's re-send horizon; past it, consumers de-duplicate by the
        ``Nats-Msg-Id`` header."""
        stream = f" {self._stream_name!r}" if self._stream_name is not None else ""
        if self._window is None or self._horizon is None:
            window = "at least the handler's re-send horizon, checked at worker start"
        else:
            window = (
                f"{self._window:g} s, at least the handler's re-send horizon of "
                f"{self._horizon:.0f} s, checked at start"
            )
        return (
            f"at least once; no duplicates stored on JetStream stream{stream} within its "
            f"duplicate window ({window}); past it, consumers de-duplicate by the "
            f"{MSG_ID_HEADER} header"
        )

    async def connect(self) -> None:
        """Connect and find the stream: ``stream`` must exist (and listen on ``subject``
        when it is a string), or a stream must listen on ``subject``.

        Raises :class:`outbox.DownstreamUnavailableError` (unreachable, credentials refused,
        JetStream not enabled) or :class:`outbox.ConfigurationError` (no such stream, no
        stream on the subject), one line each.
        """
        self._opening = asyncio.Lock()
        # A forked child's connection is its parent's: dropped, never closed from here.
        self._connection = None
        try:
            self._connection = await self._open()
        except ConfigurationError:
            raise
        except Exception as error:
            raise unavailable(self.downstream, error, self._secrets) from error

    async def check(self, app: Outbox, handler: Handler[Any]) -> None:
        """Learn the handler's ordering key (the ``Outbox-Key`` header's default), and refuse
        a handler whose events may be re-sent after the stream's duplicate window."""
        self._keys[handler.name] = self.key if self.key is not None else ordering_key(handler)
        # A subject or headers function is given the event: no row path for it.
        self._rows[handler.name] = (
            row_messages(handler, payload=self.payload, message_id=self.message_id, key=self.key)
            if isinstance(self.subject, str) and self.headers is None
            else None
        )
        check_window(app, handler, self._stream_name or "?", self._window or 0.0)
        horizon = resend_horizon(app, handler)
        self._horizon = max(horizon, self._horizon or 0.0)

    async def send(self, batch: Batch[Any]) -> Sequence[Rejection[Any]]:
        """Publish the group pipelined; the events the stream did not acknowledge, as
        rejections.

        Raises :class:`outbox.DataError` (an event cannot be made a message: nothing is
        sent) and :class:`outbox.DownstreamError` (the connection lost, or not opened again,
        before the stream acknowledged any of the group).
        """
        if not len(batch):
            return []
        connection = await self._ready()
        client = connection.client
        assert client is not None
        messages = self._from_rows(batch, client.max_payload)
        if messages is None:
            key = self._keys.get(batch.handler, self.key)
            messages = [self._message(event, key, client.max_payload) for event in batch.events]

        acks = Acks(len(messages))
        lost: Exception | None = None
        written = 0
        try:
            # One after another on one connection: written, and so stored, in id order.
            for index, (subject, body, headers) in enumerate(messages):
                reply = connection.expect(acks, index)
                await client.publish(subject, body, reply=reply, headers=headers)
                written += 1
        except (nats.errors.Error, OSError) as error:
            lost = error
        acks.written(written)
        try:
            if written:
                async with asyncio.timeout(self.ack_timeout):
                    await acks.done.wait()
        except TimeoutError:
            pass
        finally:
            connection.forget(acks)

        lost = lost or connection.lost
        rejections: list[Rejection[Any]] = []
        acknowledged = 0
        for index in range(len(messages)):
            if index in acks.answers:
                reason = acks.answers[index]
                if reason is None:
                    acknowledged += 1
                    continue
                if reason is NO_RESPONDERS:
                    subject = messages[index][0]
                    reason = f"no JetStream stream listens on subject {subject!r} (no responders)"
            elif lost is not None:
                reason = f"not acknowledged: {describe_error(lost, self._secrets)}"
            else:
                reason = f"no acknowledgement from JetStream within {self.ack_timeout:g} s"
            # Built only now, for what is rejected: a group read from its rows has no events.
            rejections.append(Rejection(batch.events[index], reason))
        if acknowledged == 0 and written and lost is None and len(acks.answers) == 0:
            # Not one answer in time: a connection that hangs is not trusted with the next.
            connection.stale = True
        if lost is not None and acknowledged == 0:
            raise downstream_failed(self.downstream, lost, self._secrets) from lost
        return rejections

    async def close(self) -> None:
        """Drain and close the connection."""
        connection, self._connection = self._connection, None
        if connection is not None:
            await connection.close()

    def _from_rows(
        self, batch: Batch[Any], max_payload: int
    ) -> list[tuple[str, bytes, dict[str, str]]] | None:
        """The group's default messages read from its rows, byte for byte what
        :meth:`_message` makes of its events; None when they are to be made from the events
        (options of the user's, a batch of events, or a message that cannot be sent: the
        events' path says which event, as a :class:`outbox.DataError`)."""
        path = self._rows.get(batch.handler)
        if path is None:
            return None
        try:
            read: list[Message] | None = path.messages(batch)
        except Exception:
            return None  # a value JSON cannot write: the events' path names the event
        if read is None:
            return None
        subject, stream = self.subject, self._stream_name
        assert isinstance(subject, str)  # a function of the event has no row path
        messages = []
        for id_, key, body in read:
            if len(body) > max_payload:
                return None
            headers = {MSG_ID_HEADER: id_}
            if key is not None:
                headers[KEY_HEADER] = key
            if stream is not None:
                headers[EXPECTED_STREAM_HEADER] = stream
            messages.append((subject, body, headers))
        return messages

    def _message(
        self, event: Any, key: Callable[[Any], str | None] | None, max_payload: int
    ) -> tuple[str, bytes, dict[str, str]]:
        try:
            headers: dict[str, str] = {} if self.headers is None else dict(self.headers(event))
            headers[MSG_ID_HEADER] = self.message_id(event)
            value = None if key is None else key(event)
            if value is not None:
                headers[KEY_HEADER] = value
            if self._stream_name is not None:
                headers[EXPECTED_STREAM_HEADER] = self._stream_name
            body = payload_bytes(self.payload(event))
            subject = per_event(self.subject, event)
            if not (isinstance(subject, str) and _is_subject(subject)):
                raise ValueError(f"not a subject to publish to: {subject!r}")
            if len(body) > max_payload:
                raise ValueError(
                    f"a body of {len(body)} bytes is over the server's max_payload of "
                    f"{max_payload} bytes"
                )
        except Exception as error:
            # The event cannot be made a message: its data, not the server, is at fault.
            raise not_a_message(getattr(event, "id", "?"), error, self._secrets) from error
        return subject, body, headers

    async def _ready(self) -> Connection:
        """The connection to publish on, opened again after a loss."""
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            connection = self._connection
            if connection is not None and connection.usable:
                return connection
            self._connection = None
            if connection is not None:
                await connection.close()
            try:
                self._connection = await self._open()
            except Exception as error:
                raise downstream_failed(self.downstream, error, self._secrets) from error
            return self._connection

    async def _open(self) -> Connection:
        connection = Connection(close_timeout=CONNECT_TIMEOUT_SECONDS)
        options: dict[str, Any] = {
            "connect_timeout": CONNECT_TIMEOUT_SECONDS,
            # Two attempts per server (nats-py counts a first try and one more), then an
            # error: an outage is outbox's to wait out, with its backoff and breaker.
            "allow_reconnect": False,
            "max_reconnect_attempts": 1,
            "reconnect_time_wait": RECONNECT_WAIT_SECONDS,
            **self.connect_options,
        }
        try:
            try:
                await connection.open(self.servers, options)
            except nats.errors.NoServersError as error:
                raise connection.last_error(error) from error
            assert connection.client is not None
            jetstream = connection.client.jetstream(timeout=CONNECT_TIMEOUT_SECONDS)
            info = await self._find_stream(jetstream)
            self._stream_name = info.config.name
            self._window = info.config.duplicate_window or 0.0
        except nats.errors.NoRespondersError as error:
            await connection.close()
            raise ConnectionError(
                "JetStream does not answer (no responders): is JetStream enabled on the "
                "server, for this account?"
            ) from error
        except BaseException:
            await connection.close()
            raise
        return connection

    async def _find_stream(self, jetstream: nats.js.JetStreamContext) -> nats.js.api.StreamInfo:
        """The stream's information: ``stream``'s, or that of the stream on ``subject``."""
        info = None if self.stream is None else await self._stream_info(jetstream, self.stream)
        if not isinstance(self.subject, str):
            assert info is not None  # a subject function needs stream=, checked at construction
            return info
        try:
            found = await jetstream.find_stream_name_by_subject(self.subject)
        except nats.js.errors.NotFoundError:
            raise ConfigurationError(
                f"{self.downstream}: no JetStream stream listens on subject {self.subject!r} "
                f"(add it to a stream's subjects)"
            ) from None
        if self.stream is not None and found != self.stream:
            raise ConfigurationError(
                f"{self.downstream}: subject {self.subject!r} belongs to JetStream stream "
                f"{found!r}, not {self.stream!r}"
            )
        return info if info is not None else await self._stream_info(jetstream, found)

    async def _stream_info(
        self, jetstream: nats.js.JetStreamContext, name: str
    ) -> nats.js.api.StreamInfo:
        try:
            return await jetstream.stream_info(name)
        except nats.js.errors.NotFoundError:
            raise ConfigurationError(
                f"{self.downstream}: no JetStream stream {name!r} (create it first, or name one "
                f"that exists)"
            ) from None


def check_window(app: Outbox, handler: Handler[Any], stream: str, window: float) -> None:
    """Refuse, in one line, a handler whose events may be re-sent after JetStream stream
    ``stream`` would drop the re-sent message (``window``: its ``duplicate_window`` in
    seconds; 0 when it has none, which is refused too)."""
    where = f"JetStream stream {stream!r}"
    if not window > 0:
        horizon = resend_horizon(app, handler)
        raise ConfigurationError(
            f"handler {handler.name!r}: {where} has no duplicate window (duplicate_window 0), "
            f"so a re-sent message would be stored twice: give it a duplicate_window of at "
            f"least {horizon:.0f} s (every retry wait, and the lease and timeout of each "
            f"attempt before the last)"
        )
    check_dedup_window(app, handler, window, where=where, lower=LOWER_HORIZON)


def _is_stream_name(name: str) -> bool:
    return bool(name) and not any(c.isspace() or c in ".*>/\\" for c in name)


# Cached: a buffer's events go to a few subjects, and checking each message's subject letter
# by letter cost a tenth of a group's time.
@functools.lru_cache(maxsize=4096)
def _is_subject(subject: str) -> bool:
    """A subject a message can be published to: dot-separated tokens, none empty, no
    whitespace and no wildcard."""
    return bool(subject) and all(
        token and token not in ("*", ">") and not any(c.isspace() for c in token)
        for token in subject.split(".")
    )


JetStreamSink = blocking_sink(AsyncJetStreamSink)
"""The sync face of :class:`AsyncJetStreamSink`: the same arguments, a sync handler."""
