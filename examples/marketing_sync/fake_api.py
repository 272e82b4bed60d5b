"""A small local stand-in for a marketing platform's bulk API (standard library only).

``POST /v1/activities/bulk`` with ``{"records": [{"id": ..., "email": ..., ...}, ...]}``:

- during an outage (``api.outage(seconds)``): ``503`` with ``Retry-After`` (the seconds until
  it is over, rounded up) for every call, nothing taken;
- more than ``max_records`` records in one call: ``413``, nothing is taken;
- more than ``rate_limit`` calls in the last second (the client's limit, all accounts
  together): ``429`` with ``Retry-After`` (the seconds until a call would be taken again,
  rounded up), nothing taken;
- a call carrying a poison record (``"kind": "poison"``): ``400`` for the whole call, nothing
  taken, and no word of which record it was (as many bulk APIs answer a record they cannot
  parse);
- a call whose ``Idempotency-Key`` was already answered: the same answer again, nothing taken
  twice;
- otherwise ``200`` with ``{"accepted": n, "rejected": [{"id": ..., "reason": ...}, ...],
  "results": [{"id": ..., "status": ...}, ...]}``: every record is taken (``"status": 200``),
  except those without an email, which are rejected one by one (``"status": 422`` and a
  ``"reason"``, for good);
- with ``account_limit`` (calls per second of each account, records naming theirs in
  ``"account_id"``; ``account_limits`` gives some accounts, on a smaller plan, a limit of their
  own): a call counts against each account it carries records of, and the records of an account
  that already had its calls in the last second are not taken but answered one by one,
  ``"status": 429`` with ``"retry_after"`` (whole seconds until that account has room). The
  call itself is ``200``: the other accounts' records are taken. A call of one account's
  records is then all 429s, which a handler reads exactly as it reads a mixed call.

It records every call (with the time it arrived) and every record it took, so that a test can
check that each activity arrived exactly once and that no second saw more calls than the
limit. Use it from Python::

    with FakeMarketingAPI(rate_limit=3) as api:
        ...  # api.url, api.calls, api.received
        api.outage(1.5)  # 503 for the next 1.5 s

or from a terminal: ``python -m examples.marketing_sync.fake_api --port 8025``.

``FakeMarketingAPIProcess`` takes the same options and is read the same way, but serves from a
process of its own, as a real API does: the arrivals it counts are not moved by what the
process that started it does (a test process that has run many tests pauses every thread for
up to a second when it collects garbage, and an API served from it would then take the calls
that arrived meanwhile all at once, in one second).
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import json
import math
import multiprocessing
import signal
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from multiprocessing.connection import Connection
from types import TracebackType
from typing import Any, Self

HOST = "127.0.0.1"
BULK_PATH = "/v1/activities/bulk"
DEFAULT_MAX_RECORDS = 1000
RATE_WINDOW_SECONDS = 1.0
SHUTDOWN_POLL_SECONDS = 0.05  # how soon stop() is noticed
POISON_KIND = "poison"


@dataclass(frozen=True, slots=True)
class Call:
    """One request to the bulk endpoint, as the API saw it."""

    idempotency_key: str | None
    records: int
    status: int
    at: float
    """When it arrived (``time.monotonic()`` of the API's process)."""
    taken: tuple[str, ...] = ()
    """The ids of the records this call took (not a replay's: those were taken before)."""
    throttled: tuple[str, ...] = ()
    """The ids of the records answered ``429`` one by one (their account had no room)."""
    accounts: tuple[str, ...] = ()
    """The accounts this call counted against (with ``account_limit``)."""


class _Served:
    """A server started by ``start()`` and stopped by ``stop()``; ``with`` does both."""

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class FakeMarketingAPI(_Served):
    """A threaded HTTP server on 127.0.0.1 that plays a bulk API. ``port=0``: a free port."""

    def __init__(
        self,
        *,
        max_records: int = DEFAULT_MAX_RECORDS,
        rate_limit: int | None = None,
        account_limit: int | None = None,
        account_limits: Mapping[str, int] | None = None,
        port: int = 0,
    ) -> None:
        self.max_records = max_records
        self.rate_limit = rate_limit
        self.account_limit = account_limit
        self.account_limits = dict(account_limits or {})
        self._port = port
        self._lock = threading.Lock()
        self._calls: list[Call] = []
        self._received: Counter[str] = Counter()
        self._rejected: dict[str, str] = {}
        self._answers: dict[str, dict[str, Any]] = {}
        self._recent: list[float] = []
        self._account_recent: defaultdict[str, list[float]] = defaultdict(list)
        self._outage_until = 0.0
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> FakeMarketingAPI:
        """Listen and serve from a background thread."""
        api = self

        class RequestHandler(_BulkRequestHandler):
            owner = api

        self._server = ThreadingHTTPServer((HOST, self._port), RequestHandler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": SHUTDOWN_POLL_SECONDS},
            name="fake-marketing-api",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket. Idempotent."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    @property
    def url(self) -> str:
        """The base URL, e.g. ``http://127.0.0.1:53127``."""
        if self._server is None:
            raise RuntimeError("the fake API is not running: call start() first")
        return f"http://{HOST}:{self._server.server_port}"

    def outage(self, seconds: float) -> None:
        """Answer every call ``503`` with ``Retry-After`` for the next ``seconds``."""
        with self._lock:
            self._outage_until = time.monotonic() + seconds

    def limit_of(self, account: str) -> int | None:
        """The calls per second the API allows ``account`` (None: no per-account limit)."""
        return self.account_limits.get(account, self.account_limit)

    # --- what it saw -------------------------------------------------------------------------

    @property
    def calls(self) -> list[Call]:
        """Every request to the bulk endpoint, in arrival order."""
        with self._lock:
            return list(self._calls)

    @property
    def received(self) -> Counter[str]:
        """Record id -> how many times a record with that id was taken (1 is right)."""
        with self._lock:
            return Counter(self._received)

    @property
    def rejected(self) -> dict[str, str]:
        """Record id -> the reason it was rejected."""
        with self._lock:
            return dict(self._rejected)

    # --- the endpoint ------------------------------------------------------------------------

    def most_calls_in_a_second(self, account: str | None = None) -> int:
        """The most calls (answered or refused) that arrived within any one second; with
        ``account``, of the calls that counted against that account."""
        calls = self.calls
        if account is not None:
            calls = [call for call in calls if account in call.accounts]
        return most_in_a_second(call.at for call in calls)

    def handle_bulk(
        self, key: str | None, records: list[dict[str, Any]], arrived: float | None = None
    ) -> tuple[int, Any, dict[str, str]]:
        """Decide one call: ``(status, body, headers)``. Thread-safe. ``arrived``: when the
        request came in (``time.monotonic()``; default: now)."""
        with self._lock:
            now = time.monotonic() if arrived is None else arrived
            call = Call(key, len(records), 0, now)
            status, body, headers, call = self._decide(key, records, call)
            self._calls.append(call)
            return status, body, headers

    def _decide(
        self, key: str | None, records: list[dict[str, Any]], call: Call
    ) -> tuple[int, Any, dict[str, str], Call]:
        status, body, headers = self._refusal(key, records, call.at)
        if status:
            return status, body, headers, dataclasses.replace(call, status=status)
        accounts = self._accounts_with_room(records, call.at)
        results: list[dict[str, Any]] = []
        taken: list[str] = []
        throttled: list[str] = []
        for record in records:
            account = _account_of(record)
            if account is not None and account in accounts and accounts[account] > 0:
                retry_after = accounts[account]
                results.append({"id": record["id"], "status": 429, "retry_after": retry_after})
                throttled.append(record["id"])
            elif not record.get("email"):
                results.append({"id": record["id"], "status": 422, "reason": "missing email"})
                self._rejected[record["id"]] = "missing email"
            else:
                results.append({"id": record["id"], "status": 200})
                self._received[record["id"]] += 1
                taken.append(record["id"])
        rejected = [
            {"id": result["id"], "reason": result["reason"]}
            for result in results
            if result["status"] == 422
        ]
        answer = {"accepted": len(taken), "rejected": rejected, "results": results}
        if key is not None:
            self._answers[key] = answer
        counted = tuple(account for account, wait in accounts.items() if wait == 0)
        return (
            200,
            answer,
            {},
            dataclasses.replace(
                call, status=200, taken=tuple(taken), throttled=tuple(throttled), accounts=counted
            ),
        )

    def _refusal(
        self, key: str | None, records: list[dict[str, Any]], now: float
    ) -> tuple[int, Any, dict[str, str]]:
        """A whole call's answer when it is not taken (status 0: it is), in the order a
        platform checks: down, a repeat, the client's limit, the size, a record it cannot
        read."""
        if now < self._outage_until:
            down_for = max(math.ceil(self._outage_until - now), 1)
            return 503, {"error": "down for maintenance"}, {"Retry-After": str(down_for)}
        if key is not None and key in self._answers:
            return 200, self._answers[key], {}
        free_in = _take(self._recent, now, self.rate_limit)
        if free_in:
            error = {"error": f"more than {self.rate_limit} calls per second"}
            return 429, error, {"Retry-After": str(max(math.ceil(free_in), 1))}
        if len(records) > self.max_records:
            return 413, {"error": f"at most {self.max_records} records per call"}, {}
        if any(record.get("kind") == POISON_KIND for record in records):
            return 400, {"error": "a record of this call could not be read"}, {}
        return 0, None, {}

    def _accounts_with_room(self, records: list[dict[str, Any]], now: float) -> dict[str, int]:
        """Each limited account of the call -> 0 when the call counts against it now (it had
        room), else the whole seconds until it has room."""
        waits: dict[str, int] = {}
        for record in records:
            account = _account_of(record)
            limit = None if account is None else self.limit_of(account)
            if account is None or limit is None or account in waits:
                continue
            free_in = _take(self._account_recent[account], now, limit)
            waits[account] = max(math.ceil(free_in), 1) if free_in else 0
        return waits


class FakeMarketingAPIProcess(_Served):
    """A :class:`FakeMarketingAPI` (the same options) served from a process of its own, with
    the same ways to read what it saw and to cause an outage."""

    def __init__(self, **options: Any) -> None:
        self._options = options
        self._lock = threading.Lock()
        self._conn: Connection | None = None
        self._process: multiprocessing.process.BaseProcess | None = None
        self._url = ""

    def start(self) -> FakeMarketingAPIProcess:
        """Start the process and wait until it listens."""
        # "spawn": a fresh interpreter, not a copy of this process and its heap.
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self._process = context.Process(
            target=_serve, args=(child, self._options), name="fake-marketing-api", daemon=True
        )
        self._process.start()
        child.close()
        self._url = self._ask("url")
        return self

    def stop(self) -> None:
        """Stop serving and end the process. Idempotent."""
        if self._conn is not None:
            self._ask("stop")
            self._conn.close()
            self._conn = None
        if self._process is not None:
            self._process.join()
            self._process = None

    @property
    def url(self) -> str:
        """The base URL, e.g. ``http://127.0.0.1:53127``."""
        return self._url

    @property
    def calls(self) -> list[Call]:
        """See :attr:`FakeMarketingAPI.calls`."""
        calls: list[Call] = self._ask("calls")
        return calls

    @property
    def received(self) -> Counter[str]:
        """See :attr:`FakeMarketingAPI.received`."""
        received: Counter[str] = self._ask("received")
        return received

    @property
    def rejected(self) -> dict[str, str]:
        """See :attr:`FakeMarketingAPI.rejected`."""
        rejected: dict[str, str] = self._ask("rejected")
        return rejected

    def outage(self, seconds: float) -> None:
        """See :meth:`FakeMarketingAPI.outage`."""
        self._ask("outage", seconds)

    def limit_of(self, account: str) -> int | None:
        """See :meth:`FakeMarketingAPI.limit_of`."""
        limit: int | None = self._ask("limit_of", account)
        return limit

    def most_calls_in_a_second(self, account: str | None = None) -> int:
        """See :meth:`FakeMarketingAPI.most_calls_in_a_second`."""
        most: int = self._ask("most_calls_in_a_second", account)
        return most

    def _ask(self, name: str, *args: Any) -> Any:
        with self._lock:
            if self._conn is None:
                raise RuntimeError("the fake API is not running: call start() first")
            self._conn.send((name, args))
            failed, value = self._conn.recv()
        if failed:
            raise RuntimeError(f"the fake API's process failed to answer {name}: {value}")
        return value


def _serve(conn: Connection, options: dict[str, Any]) -> None:
    """The fake API's own process: serve, and answer the questions its parent sends."""
    api = FakeMarketingAPI(**options).start()
    try:
        while True:
            try:
                name, args = conn.recv()
            except EOFError:  # the parent is gone
                return
            if name == "stop":
                conn.send((False, None))
                return
            try:
                value = getattr(api, name)
                conn.send((False, value(*args) if callable(value) else value))
            except Exception as error:  # sent to the parent, which raises it
                conn.send((True, repr(error)))
    finally:
        api.stop()


def most_in_a_second(times: Iterable[float]) -> int:
    """The most of ``times`` (seconds) within any one second, ``[t, t + 1)``."""
    ordered = sorted(times)
    most, first = 0, 0
    for last, at in enumerate(ordered):
        while at - ordered[first] >= RATE_WINDOW_SECONDS:
            first += 1
        most = max(most, last - first + 1)
    return most


def _take(recent: list[float], now: float, limit: int | None) -> float:
    """Count a call that arrived at ``now`` against a window of ``limit`` calls in any second
    (``recent``: the arrivals it counted, in order): 0 when it had room (it is counted), else
    the seconds until it has. Calls are decided in the order they take the lock, which may
    differ by a little from the order they arrived in: ``recent`` is kept sorted."""
    del recent[: bisect.bisect_right(recent, now - 2 * RATE_WINDOW_SECONDS)]
    window = recent[bisect.bisect_right(recent, now - RATE_WINDOW_SECONDS) :]
    if limit is not None and len(window) >= limit:
        return max(RATE_WINDOW_SECONDS - (now - window[0]), 1e-3)
    bisect.insort(recent, now)
    return 0.0


def _account_of(record: Mapping[str, Any]) -> str | None:
    account = record.get("account_id")
    return None if account is None else str(account)


class _BulkRequestHandler(BaseHTTPRequestHandler):
    owner: FakeMarketingAPI

    def do_POST(self) -> None:
        # A real API counts a call when it comes in, not once this process, sharing one
        # interpreter lock with the test that runs it, has read and parsed its body: that would
        # move some arrivals later than others and crowd them into one second.
        arrived = time.monotonic()
        if self.path != BULK_PATH:
            self._reply(404, {"error": f"no endpoint {self.path}"})
            return
        length = int(self.headers.get("Content-Length") or 0)
        try:
            records = json.loads(self.rfile.read(length))["records"]
        except (ValueError, KeyError, TypeError):
            self._reply(400, {"error": 'expected {"records": [...]}'})
            return
        key = self.headers.get("Idempotency-Key")
        status, body, headers = self.owner.handle_bulk(key, records, arrived)
        self._reply(status, body, headers)

    def _reply(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the example prints its own summary."""


def main() -> None:
    """Serve until Ctrl-C (or SIGTERM), then print what was received."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8025)
    parser.add_argument("--rate-limit", type=int, default=None, help="calls per second")
    parser.add_argument(
        "--account-limit", type=int, default=None, help="calls per second of each account"
    )
    options = parser.parse_args()
    # Stop the same way on Ctrl-C and on `kill`: both raise KeyboardInterrupt here.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    api = FakeMarketingAPI(
        rate_limit=options.rate_limit, account_limit=options.account_limit, port=options.port
    ).start()
    print(f"fake marketing API on {api.url}{BULK_PATH} (Ctrl-C to stop)")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        api.stop()
        calls = api.calls
        print(
            f"{len(calls)} calls ({sum(c.status == 429 for c in calls)} rate limited), "
            f"{sum(api.received.values())} records received, {len(api.rejected)} rejected"
        )


if __name__ == "__main__":
    main()
