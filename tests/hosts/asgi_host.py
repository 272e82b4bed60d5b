"""An ASGI application served by uvicorn: the outbox dashboard mounted at ``/outbox``, and an
endpoint that runs the shop's outbox (``POST /run-outbox``).

Its logging is uvicorn's: ``uvicorn_logging.json`` is uvicorn's default configuration with one
logger added, ``outbox``, on uvicorn's own handler at INFO.
"""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Mount, Route

from outbox.web import Auth, Principal, Role, create_app
from tests.hosts import shop

TOKEN = "token-of-the-operators-0123456789"


async def run_outbox(request: Request) -> JSONResponse:
    """Handle the shop's events that are due now (in a thread: the worker blocks)."""
    return JSONResponse(await run_in_threadpool(shop.run_burst))


dashboard = create_app(shop.outbox, auth=Auth(tokens={TOKEN: Principal("ops", Role.OPERATOR)}))
app = Starlette(
    routes=[Route("/run-outbox", run_outbox, methods=["POST"]), Mount("/outbox", app=dashboard)]
)
