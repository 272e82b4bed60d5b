"""NATS JetStream as a sink kind: per test, a stream of its own on the shared server
(``OUTBOX_TEST_NATS_URL``, default nats://127.0.0.1:4222), listening on ``<name>.>``, with a
duplicate window longer than the default retry schedule's re-send horizon; deleted after.

:func:`make_sink` and :func:`read_stored` build the same sink and read the same stream from a
destination's name alone, so that an application in a subprocess can send where a test reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import nats
import pytest
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from outbox.sinks.nats import KEY_HEADER, MSG_ID_HEADER, AsyncJetStreamSink, JetStreamSink
from tests._ports import free_ports
from tests._support import wait_for
from tests.sinks._contract import SECRET, NamedDownstream, Stored, closed_port, require_service

NATS_URL = os.environ.get("OUTBOX_TEST_NATS_URL", "nats://127.0.0.1:4222")
DUPLICATE_WINDOW_SECONDS = 2 * 3600.0
"""Longer than the re-send horizon of the default RetryPolicy (its last wait with jitter, about
44 min, plus the lease), so that a handler with the defaults passes the window check."""


def make_sink(destination: str, *, sync: bool, **options: Any) -> Any:
    """A sink publishing to stream ``destination``, on subject ``<destination>.<account>``
    (``options`` override the sink's other arguments)."""
    options.setdefault("subject", lambda event: f"{destination}.{event.account}")
    options.setdefault("stream", destination)
    cls = JetStreamSink if sync else AsyncJetStreamSink
    return cls(options.pop("servers", NATS_URL), **options)


def read_stored(destination: str, servers: str = NATS_URL) -> list[Stored]:
    """Every message stream ``destination`` holds, in sequence order."""
    return asyncio.run(read(destination, servers))


async def read(stream: str, servers: str = NATS_URL) -> list[Stored]:
    """Every message ``stream`` holds, in sequence order, read by an ephemeral consumer."""
    client = await nats.connect(servers, connect_timeout=5, allow_reconnect=False)
    try:
        jetstream = client.jetstream()
        count = (await jetstream.stream_info(stream)).state.messages
        subscription = await jetstream.pull_subscribe(
            "",
            stream=stream,
            config=ConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL),
        )
        stored: list[Stored] = []
        while len(stored) < count:
            for message in await subscription.fetch(min(1000, count - len(stored)), timeout=5):
                headers = message.headers or {}
                stored.append(
                    Stored(
                        message_id=headers[MSG_ID_HEADER],
                        key=headers.get(KEY_HEADER),
                        values=json.loads(message.data),
                    )
                )
        await subscription.unsubscribe()
        return stored
    finally:
        await client.close()


async def create(name: str, servers: str = NATS_URL, **config: Any) -> None:
    """Create stream ``name`` on subjects ``<name>.>`` (``config`` overrides the stream's
    other settings: the duplicate window is :data:`DUPLICATE_WINDOW_SECONDS` by default)."""
    config.setdefault("subjects", [f"{name}.>"])
    config.setdefault("duplicate_window", DUPLICATE_WINDOW_SECONDS)
    client = await nats.connect(servers, connect_timeout=5, allow_reconnect=False)
    try:
        await client.jetstream().add_stream(name=name, **config)
    finally:
        await client.close()


async def delete(name: str, servers: str = NATS_URL) -> None:
    """Delete stream ``name``."""
    client = await nats.connect(servers, connect_timeout=5, allow_reconnect=False)
    try:
        await client.jetstream().delete_stream(name)
    finally:
        await client.close()


def unique_name() -> str:
    """A stream name no other test uses, also the first token of its subjects."""
    return f"outbox-test-{uuid.uuid4().hex[:12]}"


class JetStreamDownstream(NamedDownstream):
    """A stream for one test."""

    make = staticmethod(make_sink)
    read = staticmethod(read_stored)

    def unreachable_sink(self, *, sync: bool) -> Any:
        """A sink whose password is the secret, pointed at a closed port."""
        return make_sink(
            self.name,
            sync=sync,
            servers=f"nats://127.0.0.1:{closed_port()}",
            connect_options={"user": "outbox", "password": SECRET},
        )


DEDUPLICATES = True
"""JetStream drops a message whose Nats-Msg-Id it stored within the duplicate window."""


@contextlib.contextmanager
def destination(**config: Any) -> Iterator[str]:
    """A stream named ``outbox-test-<uuid>`` on subjects ``<name>.>`` (see :func:`create`),
    its name given, deleted at the end."""
    parts = urlsplit(NATS_URL)
    require_service("NATS", parts.hostname or "127.0.0.1", parts.port or 4222)
    name = unique_name()
    asyncio.run(create(name, **config))
    try:
        yield name
    finally:
        asyncio.run(delete(name))


@pytest.fixture
def nats_downstream() -> Iterator[JetStreamDownstream]:
    """A JetStream stream for one test (see :func:`destination`)."""
    with destination() as name:
        yield JetStreamDownstream(name)


class PrivateServer:
    """A ``nats-server`` with JetStream of a test's own, on a free port, storing in
    ``store``: stopped and started again on the same port and store, so that a test can take
    the downstream away without touching the shared server."""

    def __init__(self, store: Path, user: str | None = None, password: str | None = None) -> None:
        program = shutil.which("nats-server")
        if program is None:
            if os.environ.get("CI") == "true":
                pytest.fail("nats-server is not installed (CI=true: broker tests must not skip)")
            pytest.skip("nats-server is not installed")
        self.port = free_ports()  # outside the ephemeral range: it is reused on restart
        self.url = f"nats://127.0.0.1:{self.port}"
        self.command = [program, "-a", "127.0.0.1", "-p", str(self.port), "-js", "-sd", str(store)]
        if user is not None and password is not None:
            self.command += ["--user", user, "--pass", password]
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the server; return once it accepts connections."""
        self.process = subprocess.Popen(
            self.command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        wait_for(self._listening, f"nats-server listening on port {self.port}")

    def kill(self) -> None:
        """Kill the server (SIGKILL): connections drop, nothing is flushed or said."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def __enter__(self) -> PrivateServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()

    def _listening(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
        except OSError:
            return False
        return True
