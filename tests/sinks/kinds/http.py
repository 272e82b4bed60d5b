"""The bulk HTTP kind: a recording bulk API served from a thread of this process.

``POST /bulk`` with ``{"records": [...]}`` stores the records in the order they arrive and
answers ``{"results": [{"status": 200}, ...]}``; a request whose ``Idempotency-Key`` was
answered before gets the same answer again, and nothing is stored twice (as a real bulk API
with idempotency keys does). ``answer_next(status, ...)`` makes the next calls answer otherwise,
``answer_for(seconds, status, ...)`` every call for a while, and ``delay`` holds every answer.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from outbox.sinks.http import AsyncBulkHTTPSink, BulkHTTPSink, StatusList
from tests.models import SinkEvent
from tests.sinks._contract import SECRET, Stored, closed_port

PATH = "/bulk"
REASON = ":reason"
"""A scripted answer's header that gives the status line's reason phrase instead."""


class RecordingAPI:
    """A bulk API that records what it took."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self.keys: list[str | None] = []
        self.answers: dict[str, tuple[int, bytes, dict[str, str]]] = {}
        self.scripted: list[tuple[int, Any, dict[str, str]]] = []
        self.until = 0.0
        self.answer_until: tuple[int, Any, dict[str, str]] | None = None
        self.delay = 0.0
        self.statuses: list[int] = []
        self.authorizations: list[str | None] = []
        self.lock = threading.Lock()
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with api.lock:
                    content = json.dumps(api.records).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                time.sleep(api.delay)
                api.authorizations.append(self.headers.get("Authorization"))
                status, content, headers = api.take(self.headers.get("Idempotency-Key"), body)
                headers = {"Content-Type": "application/json", **headers}
                self.send_response(status, headers.pop(REASON, None))
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{PATH}"

    def answer_next(
        self, status: int, body: Any = None, headers: dict[str, str] | None = None, times: int = 1
    ) -> None:
        """The next ``times`` calls answer ``status`` with ``body`` (JSON; bytes as they are)
        and store nothing; ``headers`` may set the reason phrase (:data:`REASON`) and the
        ``Content-Type``."""
        with self.lock:
            self.scripted += [(status, body, headers or {})] * times

    def answer_for(
        self, seconds: float, status: int, body: Any = None, headers: dict[str, str] | None = None
    ) -> None:
        """Every call for the next ``seconds`` answers ``status`` and stores nothing."""
        with self.lock:
            self.until = time.monotonic() + seconds
            self.answer_until = (status, body, headers or {})

    def take(self, key: str | None, body: bytes) -> tuple[int, bytes, dict[str, str]]:
        status, content, headers = self._take(key, body)
        self.statuses.append(status)
        return status, content, headers

    def _take(self, key: str | None, body: bytes) -> tuple[int, bytes, dict[str, str]]:
        with self.lock:
            self.keys.append(key)
            if key is not None and key in self.answers:
                return self.answers[key]
            if self.answer_until is not None and time.monotonic() < self.until:
                status, document, headers = self.answer_until
                return status, json.dumps(document).encode(), headers
            if self.scripted:
                status, document, headers = self.scripted.pop(0)
                content = document if isinstance(document, bytes) else json.dumps(document)
                return status, content if isinstance(content, bytes) else content.encode(), headers
            records = json.loads(body)["records"]
            self.records += records
            answer = (200, json.dumps({"results": [{"status": 200}] * len(records)}).encode(), {})
            if key is not None:
                self.answers[key] = answer
            return answer


@contextmanager
def serving() -> Iterator[RecordingAPI]:
    """A recording bulk API, served until the block ends."""
    api = RecordingAPI()
    api.thread.start()
    try:
        yield api
    finally:
        api.server.shutdown()
        api.server.server_close()


@pytest.fixture
def recording_api() -> Iterator[RecordingAPI]:
    """A recording bulk API for one test."""
    with serving() as api:
        yield api


# What the kill test asks of a kind (tests/sinks/test_kills.py): a destination by name, a
# sink for it in another process, and what it stored.
DEDUPLICATES = True
"""The API answers a repeated Idempotency-Key without storing the records again."""


@contextmanager
def destination() -> Iterator[str]:
    """A recording API's URL, served until the block ends."""
    with serving() as api:
        yield api.url


def make_sink(destination: str, *, sync: bool) -> Any:
    """A sink posting to the API at ``destination``."""
    return (BulkHTTPSink if sync else AsyncBulkHTTPSink)(destination, result=StatusList())


def read_stored(destination: str) -> list[Stored]:
    """What the API at ``destination`` stored."""
    records = httpx.get(destination, timeout=30).json()
    return [Stored(f"{SinkEvent.__tablename__}-{r['id']}", r["account"], r) for r in records]


class HTTPDownstream:
    """The contract's view of the recording API."""

    name = "http"

    def __init__(self, api: RecordingAPI) -> None:
        self.api = api

    def sink(self, *, sync: bool) -> Any:
        return make_sink(self.api.url, sync=sync)

    def unreachable_sink(self, *, sync: bool) -> Any:
        kind = BulkHTTPSink if sync else AsyncBulkHTTPSink
        url = f"http://127.0.0.1:{closed_port()}{PATH}?api_key={SECRET}"
        return kind(url, headers={"Authorization": f"Bearer {SECRET}"}, timeout=2.0)

    def stored(self) -> list[Stored]:
        with self.api.lock:
            records = list(self.api.records)
        return [Stored(f"{SinkEvent.__tablename__}-{r['id']}", r["account"], r) for r in records]


@pytest.fixture
def http_downstream(recording_api: RecordingAPI) -> HTTPDownstream:
    """The bulk HTTP kind's destination for one test."""
    return HTTPDownstream(recording_api)
