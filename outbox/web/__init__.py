"""The operators' console over HTTP (the ``web`` extra): a dashboard of server-rendered pages and
a JSON API, one ASGI application that mounts inside an existing FastAPI or Starlette
application, or runs alone (``outbox dashboard``).

::

    from outbox.web import Auth, Principal, Role, create_app

    console = create_app(app, auth=Auth(tokens={token: Principal("ci", Role.VIEWER)}))
    fastapi_app.mount("/outbox", console)

Pages and endpoints ask the same operations layer as the command line (``outbox.ops.groups``,
``outbox.ops.group_operations``, ``outbox.ops.archive``, ``outbox.ops.metrics``...), so the three
always agree. Nothing is served to a request that does not authenticate (:class:`Auth`); every
write is recorded with who made it.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Any

import msgspec
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from outbox.app import Outbox
from outbox.exceptions import ConfigurationError
from outbox.web import _limits, _render, api, bodies, databases, openapi, pages
from outbox.web._console import REFRESH_SECONDS, Console, call, console_of, require, served_by
from outbox.web._databases import Databases
from outbox.web.auth import Auth, Permission, Principal, Role

__all__ = ["Auth", "Principal", "Role", "create_app"]


def create_app(
    app: Outbox,
    *,
    auth: Auth,
    refresh_seconds: float = REFRESH_SECONDS,
    hide_payloads: Collection[str] = (),
    title: str = "outbox",
) -> Starlette:
    """The console of ``app`` as an ASGI application.

    ``auth``: who may do what (required: nothing is served without it). ``refresh_seconds``:
    how often pages refresh themselves, and how old the status they share may be (one status
    read per period, however many viewers). ``hide_payloads``: handlers whose events' values
    are never shown (pages and API alike).
    """
    if not isinstance(app, Outbox):
        raise ConfigurationError(f"app: expected an Outbox, got {type(app).__name__}")
    if not isinstance(auth, Auth):
        raise ConfigurationError(f"auth: expected an outbox.web.Auth, got {type(auth).__name__}")
    if isinstance(refresh_seconds, bool) or not (
        isinstance(refresh_seconds, int | float) and 0.5 <= refresh_seconds <= 3600
    ):
        raise ConfigurationError(
            f"refresh_seconds: expected 0.5 to 3600 seconds, got {refresh_seconds!r}"
        )
    hidden = frozenset(hide_payloads)
    for name in sorted(hidden):
        app.get_handler(name)
    if app.serves_many:
        return _of_databases(app, auth, float(refresh_seconds), hidden, title)
    console = Console(app, auth, float(refresh_seconds), hidden, title)
    routes = [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/metrics", exposition, methods=["GET"]),
        Route(f"{api.PREFIX}/openapi.json", openapi.document, methods=["GET"]),
        *api.ROUTES,
        *pages.ROUTES,
    ]
    starlette = Starlette(
        routes=routes,
        exception_handlers={HTTPException: _error},
        middleware=[Middleware(_limits.BodyLimit)],
    )
    starlette.state.console = console
    return starlette


def _of_databases(
    app: Outbox, auth: Auth, refresh_seconds: float, hidden: frozenset[str], title: str
) -> Starlette:
    """The console of an application serving several databases (:mod:`outbox.web.databases`)."""

    def build(view: Outbox) -> Starlette:
        return create_app(
            view, auth=auth, refresh_seconds=refresh_seconds, hide_payloads=hidden, title=title
        )

    starlette = Starlette(
        routes=[Route("/metrics", exposition, methods=["GET"]), *databases.ROUTES],
        exception_handlers={HTTPException: _error},
    )
    starlette.state.databases = Databases(app, auth, refresh_seconds, title, build)
    return starlette


# A path of a database's console's API, under the console of several databases.
_DATABASE_API = re.compile(rf"^/databases/[^/]+{re.escape(api.PREFIX)}(/|$)")


def _asks_api(request: Request) -> bool:
    """Whether ``request`` is for the API: its path under where the console is mounted (the
    console of several databases: its own API, or a database's)."""
    root = request.scope.get("root_path", "")
    path = request.scope["path"]
    under = path[len(root) :] if root and path.startswith(root) else path
    return under.startswith(api.PREFIX) or bool(_DATABASE_API.match(under))


async def _error(request: Request, error: Exception) -> Response:
    assert isinstance(error, HTTPException)
    headers = dict(error.headers or {})
    if _asks_api(request) or not _render.wants_html(request):
        said = msgspec.to_builtins(bodies.Error(error=error.detail))
        return JSONResponse(said, status_code=error.status_code, headers=headers)
    return _render.error_page(request, error.status_code, str(error.detail), headers)


async def healthz(request: Request) -> Response:
    """``GET /healthz``: 200 when the database answers, 503 otherwise; no authentication,
    and nothing in it but that."""
    from outbox.ops import database

    try:
        await call(database.check_connection, console_of(request).app.engine)
    except HTTPException:
        return JSONResponse({"ok": False}, status_code=503)
    except Exception:  # any failure to connect is "not healthy", said as such
        return JSONResponse({"ok": False}, status_code=503)
    return JSONResponse({"ok": True})


async def exposition(request: Request) -> Response:
    """``GET /metrics``: the handlers' gauges in Prometheus's text format (viewer)."""
    await require(request, Permission.READ)
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

    from outbox.prometheus import register

    served = served_by(request)
    if isinstance(served, Databases):
        # One collector for every scrape (each database's samples labelled with its name).
        registry = served.metrics()
    else:
        registry = CollectorRegistry()
        register(served.app, registry)
    body: Any = await call(generate_latest, registry)
    return PlainTextResponse(body, media_type=CONTENT_TYPE_LATEST)
