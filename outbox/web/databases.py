"""The console of an application serving several databases (``Outbox(databases=...)``): a page
of every database's totals at ``/`` (and as JSON at ``/api/v1/databases``), ``/healthz`` of all
of them, and each database's own console, whole, under ``/databases/{name}/``.

A database's console is ``create_app(app.on(name), ...)`` with the same auth, refresh period,
hidden payloads and title, made on its first request and kept while ``app.on(name)`` gives the
same application (the registry gives the same URL). It is served as if it were mounted there
on its own: its links, forms, redirects, CSRF cookie and static files stay under its path.
"""

from __future__ import annotations

import datetime as dt
import time

from markupsafe import Markup
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.types import Receive, Scope, Send

from outbox.web import openapi, pages
from outbox.web._console import authenticate, require
from outbox.web._databases import Databases
from outbox.web._render import FLEET_PATH, moment, page
from outbox.web.api import PREFIX, answer
from outbox.web.auth import Permission

__all__ = ["ROUTES"]

DATABASE_ROUTE = "databases.database"
"""The name of the mount of each database's console (``link(DATABASE_ROUTE, database=name,
path='/')``)."""


def databases_of(request: Request) -> Databases:
    found: Databases = request.app.state.databases
    return found


async def overview(request: Request) -> Response:
    """``/``: a line per database with its totals, and a line of all of them."""
    principal = await require(request, Permission.READ)
    status = await databases_of(request).status()
    return page(
        request,
        principal,
        "databases.html",
        {
            "status": status,
            "as_of": time.strftime("%H:%M:%S UTC", time.gmtime(status.taken_at)),
            "read_at": _read_at,
        },
        nav="overview",
    )


def _read_at(taken_at: float) -> Markup:
    return moment(dt.datetime.fromtimestamp(taken_at, dt.UTC))


async def status(request: Request) -> Response:
    """``GET /api/v1/databases``: the overview's numbers as JSON."""
    await require(request, Permission.READ)
    return answer(await databases_of(request).status())


async def healthz(request: Request) -> Response:
    """``GET /healthz``: how many databases answer a connection (within a couple of seconds)
    of how many the registry lists; no authentication, so no name (tenants' names are often
    their customers'; the page says which). 200 when at least one does (or the registry lists
    none), 503 when none does or the registry cannot be read; ``ok`` is true only when all
    do."""
    try:
        answered = await databases_of(request).health()
    except HTTPException:
        return JSONResponse({"ok": False, "answering": 0, "databases": 0}, status_code=503)
    answering = sum(answered.values())
    some = answering > 0 or not answered
    return JSONResponse(
        {"ok": answering == len(answered), "answering": answering, "databases": len(answered)},
        status_code=200 if some else 503,
    )


class _DatabaseConsole:
    """ASGI: ``/databases/{database}/...`` to that database's console, as a console mounted
    there on its own sees it: its URLs are built from its own routes under its own path (not
    the routes of the application it is mounted in, which does not know them), and the page
    of every database is given to its header (:data:`outbox.web._render.FLEET_PATH`)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        databases = databases_of(request)
        name = request.path_params["database"]
        console = await databases.console(name)
        if console is None:
            # Said only to whom authenticates, and the names listed only to a reader.
            principal = await authenticate(request)
            names = await databases.names()
            known = f" (databases: {', '.join(names) or 'none listed now'})"
            listed = known if principal.role.allows(Permission.READ) else ""
            raise HTTPException(404, f"no database {name!r}{listed}")
        own = dict(scope)
        own[FLEET_PATH] = request.url_for("pages.overview").path
        own.pop("router", None)
        own["app_root_path"] = scope.get("root_path", "")
        own["path_params"] = {}
        await console(own, receive, send)


ROUTES: list[BaseRoute] = [
    Route("/", overview, methods=["GET"], name="pages.overview"),
    Route("/healthz", healthz, methods=["GET"]),
    Route(f"{PREFIX}/databases", status, methods=["GET"]),
    Route(f"{PREFIX}/openapi.json", openapi.databases_document, methods=["GET"]),
    Route("/static/{name}", pages.static, methods=["GET"], name="pages.static"),
    Mount("/databases/{database}", app=_DatabaseConsole(), name=DATABASE_ROUTE),
]
