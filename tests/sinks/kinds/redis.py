"""Redis Streams as a sink kind: a stream of its own per test on the Redis at 6379 (or
``OUTBOX_TEST_REDIS_URL``), deleted after it."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis

from outbox.sinks.redis import AsyncRedisStreamSink, RedisStreamSink
from tests.sinks._contract import SECRET, Stored, closed_port, require_service

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


class RedisDownstream:
    """A stream made for one test."""

    def __init__(self, name: str) -> None:
        self.name = name

    def sink(self, *, sync: bool) -> Any:
        """A sink appending to this stream."""
        return make_sink(self.name, sync=sync)

    def unreachable_sink(self, *, sync: bool) -> Any:
        """A sink with a password, pointed at a port nothing listens on."""
        url = f"redis://:{SECRET}@127.0.0.1:{closed_port()}/0"
        return make_sink(self.name, sync=sync, url=url)

    def stored(self) -> list[Stored]:
        """The stream's messages, in order."""
        return read_stored(self.name)


@pytest.fixture
def redis_downstream() -> Iterator[RedisDownstream]:
    """A stream of its own for one test, deleted after it."""
    url = urlsplit(redis_url())
    require_service("Redis", url.hostname or "127.0.0.1", url.port or 6379)
    downstream = RedisDownstream(f"outbox-test-{uuid.uuid4().hex}")
    try:
        yield downstream
    finally:
        with redis.Redis.from_url(redis_url()) as client:
            client.delete(downstream.name)
