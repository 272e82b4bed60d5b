"""A ready consumer of a Redis stream into an inbox, as one consumer of a consumer group
(redis-py, ``pip install 'sqlalchemy-outbox[redis]'``): each batch's new entries have their
effect, and their ``id`` field is recorded, in one transaction; the batch is ``XACK``-ed
after the commit.

    from outbox.inbox.redis import RedisStreamConsumer

    orders_in = app.inbox("orders-in", sender="orders")

    def apply(session: Session, messages: list[Message]) -> None:
        session.add_all(Order(**m.json()) for m in messages)

    RedisStreamConsumer(app, orders_in, apply, stream="orders", group="billing").run()

The consumer is sync, on redis-py's blocking client: its effect is a plain function called
with a ``Session`` (an async effect is refused where it is given). See docs/inbox.md, "Ready
consumers".
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import redis
import redis.exceptions
from sqlalchemy import Engine

from outbox._core import log as _log
from outbox.app import Outbox
from outbox.exceptions import ConfigurationError
from outbox.inbox import Inbox
from outbox.inbox._consumer import (
    BATCH_SIZE,
    MAX_DELIVERIES,
    PRUNE_CHUNKS,
    PRUNE_INTERVAL_SECONDS,
    ConsumeResult,
    Effect,
    Message,
    Verdict,
    first_line,
)
from outbox.inbox._loop import SyncConsumer, Taken
from outbox.inbox._settings import check_settings, sync_engine

__all__ = ["ConsumeResult", "Message", "RedisStreamConsumer"]

DEFAULT_URL = "redis://127.0.0.1:6379/0"
CLAIM_IDLE_SECONDS = 30.0
"""How long an entry stays pending (delivered, not acknowledged) before a consumer of the
group takes it over: from a consumer that went away, or again after its effect failed. Keep
it above the time a batch takes to apply: an entry claimed from a consumer still applying it
is applied twice over, and the inbox makes the second a repeat, but the work is done twice."""
ID_FIELD = "id"
"""The field that holds the message id (the Redis sink's)."""
PAYLOAD_FIELD = "payload"
"""The field that holds the body (the Redis sink's)."""
DEAD_SUFFIX = ":dead"
"""The dead stream's name, unless given: the stream's, with this suffix."""
_BLOCK_SECONDS = 0.5
"""How long one XREADGROUP blocks: a stop, and entries to claim, are seen within it."""


_GROUP_GONE = ("NOGROUP", "UNBLOCKED")
"""How Redis answers a read of a group whose stream (or the group itself) was deleted."""


class GroupLostError(ConnectionError):
    """The consumer group or its stream was deleted: taken as a lost connection, and the
    group made again when the consumer connects again."""


class RedisStreamConsumer(SyncConsumer):
    """Consumes ``stream`` as consumer ``consumer`` of ``group`` into ``inbox``: the effect of
    each batch's new entries and their ids in one transaction, then the ``XACK``.

    ``database``: the Outbox application (its engine) or an Engine. ``inbox``: from
    ``app.inbox(...)``. ``effect(session, messages)``: a sync function, called in the batch's
    transaction with the entries whose ``id`` field the inbox did not hold (a :class:`Message`
    each: ``id``, ``body`` (the ``payload`` field), ``headers`` (the other fields),
    ``deliveries``); it must not commit. ``url``: the server. ``stream``, ``group``: the
    stream and the consumer group (created, from the stream's first entry, with the stream
    if missing). ``consumer``: this consumer's name in the group (default: host and process
    id); the entries a consumer left pending are claimed, by it started again or by another,
    once idle for ``claim_idle``.
    ``dead_stream``: where dead letters go (default ``<stream>:dead``). ``claim_idle``: seconds
    an entry stays pending before it is claimed (``XAUTOCLAIM``) from a consumer that went
    away, or retried here after its effect failed.

    On failure: an effect that raises rolls the transaction back; the batch's entries are
    then applied one by one, each in its own transaction, so that only the failing one is left
    pending, and claimed again ``claim_idle`` seconds later (its pause). When its delivery
    count (``XPENDING``'s, which ``XAUTOCLAIM`` raises) reaches ``max_deliveries``, it is
    dead-lettered: ``XADD`` to the dead stream with its fields, ``entry`` (its entry id),
    ``deliveries`` and ``error``, then ``XACK`` once the ``XADD`` succeeded; an error line
    names its id and error. An entry without an ``id`` field is dead-lettered the same way at
    once. While the database cannot be reached, the batch is held unacknowledged and tried
    again after a growing pause; a lost connection to Redis is opened again after one (the
    entries stay pending, and a repeat is acknowledged without effect).
    """

    kind = "Redis stream"
    pause_before_retry = False  # a failed entry stays pending for claim_idle seconds
    broker_errors = (
        redis.exceptions.ConnectionError,
        redis.exceptions.TimeoutError,
        OSError,
    )

    def __init__(
        self,
        database: Outbox | Engine,
        inbox: Inbox,
        effect: Effect,
        *,
        stream: str,
        group: str,
        consumer: str | None = None,
        url: str = DEFAULT_URL,
        dead_stream: str | None = None,
        claim_idle: float = CLAIM_IDLE_SECONDS,
        batch_size: int = BATCH_SIZE,
        max_deliveries: int = MAX_DELIVERIES,
        prune_interval: float = PRUNE_INTERVAL_SECONDS,
        prune_chunks: int = PRUNE_CHUNKS,
    ) -> None:
        for name, value in (("stream", stream), ("group", group)):
            if not isinstance(value, str) or not value:
                raise ConfigurationError(f"{name}: expected a name, got {value!r}")
        check_settings(f"Redis consumer of {stream!r}", claim_idle=claim_idle)
        if not isinstance(url, str) or urlsplit(url).scheme not in ("redis", "rediss", "unix"):
            raise ConfigurationError(
                f"url: expected redis://[user:password@]host[:port][/db] (or rediss://, "
                f"unix://), got {_shown(url)}"
            )
        super().__init__(
            sync_engine(database, f"Redis consumer of {stream!r}"),
            inbox,
            effect,
            source=stream,
            batch_size=batch_size,
            max_deliveries=max_deliveries,
            failure_pause=claim_idle,
            prune_interval=prune_interval,
            prune_chunks=prune_chunks,
        )
        self.stream = stream
        self.group = group
        self.consumer = consumer or f"{socket.gethostname()}-{os.getpid()}"
        self.url = url
        self.dead_stream = dead_stream or stream + DEAD_SUFFIX
        self.claim_idle = float(claim_idle)
        self._client: redis.Redis | None = None

    def _open(self) -> None:
        client = redis.Redis.from_url(self.url)
        try:
            client.xgroup_create(self.stream, self.group, id="0", mkstream=True)
        except redis.exceptions.ResponseError as error:
            if "BUSYGROUP" not in str(error):  # the group exists: what it has read stays read
                client.close()
                raise
        except BaseException:
            client.close()
            raise
        self._client = client

    def _close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            client.close()

    def _take(self, limit: int, wait: float) -> list[Taken]:
        try:
            return self._read(limit, wait)
        except redis.exceptions.ResponseError as error:
            if not str(error).startswith(_GROUP_GONE):
                raise
            # The stream or its group was deleted: opened again, the group made anew.
            raise GroupLostError(f"{first_line(error)} (making the group again)") from error

    def _read(self, limit: int, wait: float) -> list[Taken]:
        client = self._client
        assert client is not None
        waited = 0.0
        while not self._stopping.is_set():
            claimed = self._claim(client, limit)
            if claimed:
                return claimed
            block = max(1, int(min(_BLOCK_SECONDS, wait - waited) * 1000))
            answer: Any = client.xreadgroup(
                self.group, self.consumer, {self.stream: ">"}, count=limit, block=block
            )
            entries = answer[0][1] if answer else []
            if entries:
                return [self._message(entry_id, fields, 1) for entry_id, fields in entries]
            waited += block / 1000
            if waited >= wait:
                return []
        return []

    def _claim(self, client: redis.Redis, limit: int) -> list[Taken]:
        """Entries pending longer than ``claim_idle`` in the group (a consumer that went away,
        or a failed effect here), taken over with their delivery counts."""
        answer: Any = client.xautoclaim(
            self.stream,
            self.group,
            self.consumer,
            min_idle_time=int(self.claim_idle * 1000),
            start_id="0-0",
            count=limit,
        )
        entries = [(entry_id, fields) for entry_id, fields in answer[1] if fields is not None]
        if not entries:
            return []
        pending: Any = client.xpending_range(
            self.stream,
            self.group,
            min=entries[0][0],
            max=entries[-1][0],
            count=len(entries),
            consumername=self.consumer,
        )
        counts = {row["message_id"]: int(row["times_delivered"]) for row in pending}
        return [self._message(e, fields, counts.get(e, 2)) for e, fields in entries]

    def _message(self, entry_id: bytes, fields: dict[bytes, bytes], deliveries: int) -> Taken:
        decoded = {k.decode(errors="replace"): v for k, v in fields.items()}
        message_id = decoded.pop(ID_FIELD, b"")
        body = decoded.pop(PAYLOAD_FIELD, b"")
        headers = {k: v.decode(errors="replace") for k, v in decoded.items()}
        try:
            text_id = message_id.decode()
        except UnicodeDecodeError:
            # Decoded loosely, two different ids would read the same: refused as no id.
            text_id = ""
        message = Message(
            id=text_id,
            body=body,
            headers=headers,
            deliveries=deliveries,
            source=self.stream,
            broker_id=entry_id.decode(),
        )
        return message, (entry_id, fields)

    def _settle(
        self, taken: Sequence[Taken], verdicts: Sequence[Verdict], errors: Sequence[str]
    ) -> None:
        client = self._client
        assert client is not None
        settled = list(zip(taken, verdicts, errors, strict=True))
        done = [handle[0] for (_, handle), verdict, _ in settled if verdict is Verdict.ACK]
        if done:
            client.xack(self.stream, self.group, *done)
        for (message, (entry_id, fields)), verdict, error in settled:
            if verdict is not Verdict.DEAD:
                continue  # a failed entry stays pending, claimed again after claim_idle
            # The dead letter first, the XACK only once it is written: an entry whose dead
            # letter Redis refused (a dead stream of another type, out of memory) stays
            # pending, and is dead-lettered again when claimed.
            try:
                client.xadd(
                    self.dead_stream,
                    {
                        **fields,
                        b"entry": entry_id,
                        b"deliveries": str(message.deliveries).encode(),
                        b"error": error.encode(),
                    },
                )
            except redis.exceptions.ResponseError as refused:
                self._log.error(
                    _log.INBOX_DEAD_LETTER_FAILED,
                    consumer=self.name,
                    message_id=message.id,
                    dead_stream=self.dead_stream,
                    error=first_line(refused),
                )
                continue
            client.xack(self.stream, self.group, entry_id)


def _shown(url: object) -> str:
    """What a refused URL is, without the URL: it may hold a password."""
    if isinstance(url, str):
        return f"a URL with scheme {urlsplit(url).scheme!r}"
    return type(url).__name__
