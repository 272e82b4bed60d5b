"""How much of a request the console reads: a body of :data:`MAX_BODY_BYTES` at most, counted
as it arrives, whether or not the request states its length (a chunked body states none).

:class:`BodyLimit` wraps the application's ``receive``: a page's form and an API body are read
through it alike, and the read that passes the limit raises a 413 that the console's error
handler answers (JSON for the API, a page for a browser). Nothing past the limit is read: the
server stops taking the client's bytes when the application stops asking for them.
"""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

MAX_BODY_BYTES = 16 * 1024 * 1024
"""The largest request body the console reads: a batch of ingest at its largest fits."""


def too_large(limit: int) -> HTTPException:
    # Connection: close, so that the server closes the connection after the answer rather
    # than read (and throw away) the rest of the body to keep it open for the next request.
    return HTTPException(
        413, f"request body larger than {limit} bytes", headers={"Connection": "close"}
    )


class BodyLimit:
    """ASGI middleware: a request body past ``max_bytes`` is a 413 as soon as it is known to
    be, from its ``Content-Length`` at the first read, or else from the bytes read so far."""

    def __init__(self, app: ASGIApp, max_bytes: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        stated = dict(scope["headers"]).get(b"content-length", b"")
        declared = int(stated) if stated.isdigit() else None
        received = 0

        async def limited() -> Message:
            # Raised here, inside the endpoint that reads: its 413 is answered as every other
            # error of the console, and an endpoint that never reads its body never refuses it.
            nonlocal received
            if declared is not None and declared > self.max_bytes:
                raise too_large(self.max_bytes)
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise too_large(self.max_bytes)
            return message

        await self.app(scope, limited, send)
