"""Redis Streams as a sink kind: a stream of its own per test on the Redis at 6379 (or
``OUTBOX_TEST_REDIS_URL``), deleted after it; and a private Redis server a test may stop and
start again (the shared one is never stopped)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis

from outbox.sinks.redis import AsyncRedisStreamSink, RedisStreamSink
from tests._ports import free_ports
from tests._support import wait_for
from tests.sinks._contract import SECRET, NamedDownstream, Stored, closed_port, require_service

REDIS_URL_ENV = "OUTBOX_TEST_REDIS_URL"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


def redis_url() -> str:
    """The URL of the Redis the tests use."""
    return os.environ.get(REDIS_URL_ENV, DEFAULT_REDIS_URL)


def make_sink(destination: str, *, sync: bool, url: str | None = None) -> Any:
    """A sink appending to the stream ``destination``: the sync class or the async one."""
    cls = RedisStreamSink if sync else AsyncRedisStreamSink
    return cls(url or redis_url(), stream=destination)


def read_stored(destination: str, url: str | None = None) -> list[Stored]:
    """Every message of the stream ``destination``, in the order Redis stored them."""
    with redis.Redis.from_url(url or redis_url()) as client:
        entries = client.xrange(destination)
    return [
        Stored(
            message_id=fields[b"id"].decode(),
            key=fields[b"key"].decode() if b"key" in fields else None,
            values=json.loads(fields[b"payload"]),
        )
        for _, fields in entries
    ]


class RedisDownstream(NamedDownstream):
    """A stream made for one test."""

    make = staticmethod(make_sink)
    read = staticmethod(read_stored)

    def unreachable_sink(self, *, sync: bool) -> Any:
        """A sink with a password, pointed at a port nothing listens on."""
        url = f"redis://:{SECRET}@127.0.0.1:{closed_port()}/0"
        return make_sink(self.name, sync=sync, url=url)


DEDUPLICATES = False
"""Redis 7 stores a re-sent message again: consumers de-duplicate by its ``id`` field."""


@contextmanager
def destination() -> Iterator[str]:
    """A stream's name, deleted at the end."""
    url = urlsplit(redis_url())
    require_service("Redis", url.hostname or "127.0.0.1", url.port or 6379)
    name = f"outbox-test-{uuid.uuid4().hex}"
    try:
        yield name
    finally:
        with redis.Redis.from_url(redis_url()) as client:
            client.delete(name)


@pytest.fixture
def redis_downstream() -> Iterator[RedisDownstream]:
    """A stream of its own for one test, deleted after it."""
    with destination() as name:
        yield RedisDownstream(name)


class RedisServer:
    """A ``redis-server`` of a test's own, on a free port, keeping its data in ``directory``
    only when stopped (``SHUTDOWN SAVE``): started again, it has every message it
    acknowledged before it stopped."""

    def __init__(self, directory: Path, password: str | None = None) -> None:
        program = shutil.which("redis-server")
        if program is None:
            message = "redis-server is not installed (apt-get install redis-server)"
            if os.environ.get("CI") == "true":
                pytest.fail(f"{message} (CI=true: broker tests must not skip)", pytrace=False)
            pytest.skip(message)
        self.program = program
        self.directory = directory
        self.password = password
        self.port = free_ports()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The server's URL, with its password."""
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        """A client of the server's own (close it)."""
        return redis.Redis.from_url(self.url)

    def start(self) -> None:
        """Start the server and wait until it answers."""
        command = [self.program, "--port", str(self.port), "--bind", "127.0.0.1"]
        command += ["--save", "", "--appendonly", "no", "--dir", str(self.directory)]
        if self.password:
            command += ["--requirepass", self.password]
        self.process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        wait_for(self._answers, f"redis-server on port {self.port}")

    def __enter__(self) -> RedisServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()

    def stop(self) -> None:
        """Stop the server, its data saved (``SHUTDOWN SAVE``), and wait until it is gone."""
        assert self.process is not None
        with self.client() as client, contextlib.suppress(redis.ConnectionError):
            client.shutdown(save=True)
        self.process.wait(timeout=20)
        self.process = None

    def kill(self) -> None:
        """Kill the server, if it runs (its data is lost)."""
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=20)
            self.process = None

    def xadd_calls(self) -> int:
        """How many XADD commands the server ran since it started."""
        with self.client() as client:
            stats = client.info("commandstats")
        return int(stats.get("cmdstat_xadd", {}).get("calls", 0))

    def _answers(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f"redis-server exited with {self.process.returncode}")
        try:
            with self.client() as client:
                return bool(client.ping())
        except redis.ConnectionError:
            return False
