"""The dashboard's pages: server-rendered HTML (Jinja2), refreshed in place by a little plain
JavaScript, every action a form that carries the page's CSRF token."""

from __future__ import annotations

import html

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import BaseRoute

ROUTES: list[BaseRoute] = []


def wants_html(request: Request) -> bool:
    """Whether the request is a browser's, for a page rather than JSON."""
    return "text/html" in request.headers.get("accept", "")


def error_page(request: Request, status: int, detail: str, headers: dict[str, str]) -> Response:
    """An error as a small page, its text escaped."""
    body = f"<!doctype html><title>{status}</title><h1>{status}</h1><p>{html.escape(detail)}</p>"
    return HTMLResponse(body, status_code=status, headers=headers)
