"""One NATS connection to publish on, and the JetStream acknowledgements of a group's
messages: a reply subject per message under one wildcard subscription, the answers gathered
by index, and a reply read as stored or as the reason it was not."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import nats.aio.client
import nats.aio.msg


@dataclass(slots=True)
class Acks:
    """The answers to one group's messages, by index: None for stored, else the reason it
    was not; a message with no answer yet is missing from ``answers``."""

    expected: int
    answers: dict[int, str | None] = field(default_factory=dict)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    tokens: list[str] = field(default_factory=list)

    def answer(self, index: int, reason: str | None) -> None:
        self.answers.setdefault(index, reason)
        if len(self.answers) >= self.expected:
            self.done.set()

    def written(self, count: int) -> None:
        """Only ``count`` messages went out: answers are awaited for those alone."""
        self.expected = count
        if len(self.answers) >= count:
            self.done.set()


class Connection:
    """One NATS connection and the reply subscription every acknowledgement of it comes to
    (one wildcard subscription, a reply subject per message under it)."""

    def __init__(self, close_timeout: float) -> None:
        self.client: nats.aio.client.Client | None = None
        self.errors: list[Exception] = []
        self.lost: Exception | None = None
        self.stale = False
        self._prefix = ""
        self._next = 0
        self._waiting: dict[str, tuple[Acks, int]] = {}
        self._close_timeout = close_timeout

    async def open(self, servers: list[str], options: Mapping[str, Any]) -> None:
        """Connect, and subscribe to the replies."""
        self.client = client = nats.aio.client.Client()
        await client.connect(
            servers,
            **options,
            error_cb=self._on_error,
            disconnected_cb=self._on_disconnected,
            closed_cb=self._on_closed,
        )
        self.errors.clear()  # a first attempt's error is not what a later loss is about
        self._prefix = client.new_inbox()
        await client.subscribe(f"{self._prefix}.*", cb=self._on_reply)

    @property
    def usable(self) -> bool:
        return (
            self.client is not None
            and self.client.is_connected
            and self.lost is None
            and not self.stale
        )

    def last_error(self, default: Exception) -> Exception:
        """The error the client last reported (nats.connect raises ``NoServersError`` after
        its attempts, the reason being the error before it)."""
        return self.errors[-1] if self.errors else default

    def expect(self, acks: Acks, index: int) -> str:
        """A reply subject for message ``index`` of ``acks``."""
        self._next += 1
        token = str(self._next)
        self._waiting[token] = (acks, index)
        acks.tokens.append(token)
        return f"{self._prefix}.{token}"

    def forget(self, acks: Acks) -> None:
        """Stop waiting for ``acks`` (answered, timed out or cancelled): a late reply is
        dropped."""
        for token in acks.tokens:
            self._waiting.pop(token, None)

    async def close(self) -> None:
        """Flush what is written, then close (forced after ``close_timeout`` seconds)."""
        client = self.client
        if client is None or client.is_closed:
            return
        try:
            async with asyncio.timeout(self._close_timeout):
                await client.drain()
        except Exception:
            with contextlib.suppress(Exception):
                await client.close()

    async def _on_reply(self, msg: nats.aio.msg.Msg) -> None:
        waiting = self._waiting.pop(msg.subject[len(self._prefix) + 1 :], None)
        if waiting is not None:
            acks, index = waiting
            acks.answer(index, refusal(msg))

    async def _on_error(self, error: Exception) -> None:
        # Recorded rather than logged: the sink raises or returns it, in one line.
        self.errors.append(error)
        del self.errors[:-5]

    async def _on_disconnected(self) -> None:
        self.lost = self.lost or self.last_error(ConnectionError("disconnected from the server"))

    async def _on_closed(self) -> None:
        self.lost = self.lost or self.last_error(ConnectionError("connection closed"))
        waiting, self._waiting = self._waiting, {}
        for acks, _ in waiting.values():
            acks.done.set()  # no answer will come: the group stops waiting for it


NO_RESPONDERS = "no responders"
"""The server's answer to a message no stream listens for (its status 503)."""


def refusal(msg: nats.aio.msg.Msg) -> str | None:
    """None when the reply is a ``PubAck`` (a duplicate one too: stored before), else why the
    message was not stored."""
    if msg.data.startswith(b'{"stream":'):
        # The server writes an error first ({"error":...}): this is a PubAck, read without
        # parsing (a parse per message cost a tenth of a group's time).
        return None
    if msg.headers and msg.headers.get("Status") == "503":
        return NO_RESPONDERS
    try:
        answer = json.loads(msg.data)
    except ValueError:
        return f"JetStream answered with what is not a PubAck: {msg.data[:80]!r}"
    error = answer.get("error") if isinstance(answer, dict) else None
    if error is None:
        return None
    return (
        f"refused by JetStream: {error.get('description', error)} "
        f"(code {error.get('code')}, err_code {error.get('err_code')})"
    )
