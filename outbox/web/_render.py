"""How the dashboard's pages are drawn: the Jinja2 environment and its filters (what a page
shows of a value: cut, and with its invisible characters spelled out), the headers every page
carries, the CSRF cookie a page sets for its forms, and the error page.

A page asked for with ``X-Outbox-Fragment: 1`` is drawn as its main part only: what
``static/console.js`` swaps in every refresh period.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import jinja2
from markupsafe import Markup
from starlette.requests import Request
from starlette.responses import Response
from starlette.templating import Jinja2Templates

from outbox._core.durations import Timed, duration
from outbox._core.values import jsonable
from outbox.web._console import Console, served_by
from outbox.web.auth import CSRF_COOKIE, CSRF_FIELD, Permission, Principal, new_csrf_token

FLEET_PATH = "outbox.fleet_path"
"""The ASGI scope's key that holds, in the console of one database served by the console of
several, the path of the page of all of them (the header links back to it)."""
FRAGMENT_HEADER = "X-Outbox-Fragment"
"""A request with this header set to ``1`` gets the page's main part only (a refresh)."""
VALUE_SHOWN = 2_000
"""Characters of one text value of an event a page shows; the rest are counted."""
PAYLOAD_SHOWN = 20_000
"""Characters of an event's values (as JSON) a page shows; the rest are counted."""
PREVIEW_SHOWN = 120
"""Characters of an event's values a collapsed payload shows on its one line."""
FLASH_SHOWN = 300
"""Characters of a message after a write that a page shows."""

_TEMPLATES = Path(__file__).parent / "templates"
# Pages run no script but console.js, and load nothing from elsewhere; a bar's width is an
# inline style. No page may be framed (a write button under someone else's page).
_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
        "img-src 'self' data:; connect-src 'self'; form-action 'self'; base-uri 'none'; "
        "frame-ancestors 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
    "Vary": FRAGMENT_HEADER,
}
# Characters that would act on the text around them rather than show: control characters and
# the bidirectional overrides and isolates. Shown as \uXXXX instead.
_INVISIBLE = re.compile(
    "[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]"
)
_TOKEN = re.compile(r"[A-Za-z0-9_-]{32,128}")


def _visible(value: Any) -> Any:
    """What a page shows of ``value``: nothing for None, text with its invisible characters
    spelled out (Jinja2 escapes it next)."""
    if value is None:
        return ""
    if isinstance(value, str) and not isinstance(value, Markup):
        return _INVISIBLE.sub(lambda m: f"\\u{ord(m.group()):04x}", value)
    return value


def age(seconds: float | None) -> Markup:
    """:func:`duration` with the exact seconds in its ``title`` (shown on hover); a dash for
    none. What every page shows of an age or a duration."""
    if seconds is None or seconds != seconds:
        return Markup("—")
    return Markup('<span class="age" title="{exact} s">{text}</span>').format(
        exact=_exact_seconds(seconds), text=duration(seconds)
    )


def timed(sentence: Any) -> Markup:
    """A sentence (an alert, a pause, a silent holder) as a page shows it: each of its
    durations (:class:`outbox._core.durations.Timed` keeps them) with its exact seconds on hover,
    the
    text around them escaped and with its invisible characters spelled out."""
    if not isinstance(sentence, Timed):
        return Markup("{}").format(_visible(sentence))
    return Markup("").join(
        Markup("{}").format(_visible(part)) if isinstance(part, str) else age(part)
        for part in sentence.parts
    )


def _exact_seconds(seconds: float) -> str:
    return f"{seconds:,.3f}".rstrip("0").rstrip(".")


def moment(value: Any, now: dt.datetime | None = None) -> Markup:
    """A point in time as its age (``3 min ago``, ``in 2 h 5 min``), the exact time (UTC) in
    its ``title``; a time without a zone is UTC, as outbox stores every time."""
    if not isinstance(value, dt.datetime):
        return Markup("{}").format(_when(value))
    at = value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    seconds = ((now or dt.datetime.now(dt.UTC)) - at).total_seconds()
    text = f"in {duration(-seconds)}" if seconds < 0 else f"{duration(seconds)} ago"
    exact = at.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f UTC")
    return Markup('<time class="age" datetime="{iso}" title="{exact}">{text}</time>').format(
        iso=at.isoformat(), exact=exact, text=text
    )


def _count(value: int, cap: int | None = None) -> str:
    """A count with its thousands marked; ``at least`` when it reached the ``cap`` it was
    counted to."""
    return f"at least {value:,}" if cap is not None and value >= cap else f"{value:,}"


def _first_line(text: str | None, length: int = 200) -> str:
    lines = (text or "").strip().splitlines()
    line = lines[0] if lines else ""
    return line if len(line) <= length else f"{line[:length]}…"


def _cut(value: Any) -> Any:
    if isinstance(value, str) and len(value) > VALUE_SHOWN:
        return f"{value[:VALUE_SHOWN]}... ({len(value) - VALUE_SHOWN:,} more characters)"
    if isinstance(value, dict):
        return {k: _cut(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_cut(v) for v in value]
    return value


def payload_text(values: Mapping[str, Any]) -> str:
    """An event's values as a page shows them: JSON with every character outside ASCII
    escaped (no control or bidirectional character reaches the page), each text cut at
    :data:`VALUE_SHOWN` characters and the whole at :data:`PAYLOAD_SHOWN`."""
    shown = _cut(jsonable(dict(values)))
    text = json.dumps(shown, ensure_ascii=True, indent=2, sort_keys=True)
    if len(text) > PAYLOAD_SHOWN:
        more = len(text) - PAYLOAD_SHOWN
        text = f"{text[:PAYLOAD_SHOWN]}\n… {more:,} more characters"
    return text


def payload_preview(values: Mapping[str, Any]) -> str:
    """An event's values on one line, as a collapsed payload shows them: compact JSON with
    every character outside ASCII escaped, cut at :data:`PREVIEW_SHOWN` characters."""
    shown = _cut(jsonable(dict(values)))
    text = json.dumps(shown, ensure_ascii=True, sort_keys=True, separators=(", ", ": "))
    return text if len(text) <= PREVIEW_SHOWN else f"{text[:PREVIEW_SHOWN]}…"


def _when(value: Any) -> str:
    if hasattr(value, "strftime"):
        return str(value.strftime("%Y-%m-%d %H:%M:%S"))
    return str(value)


@jinja2.pass_context
def _link(context: Any, route: str, /, query: Any = None, **params: Any) -> str:
    """The path of a page (under wherever the console is mounted), with a query string."""
    request: Request = context["request"]
    path = request.url_for(route, **{k: str(v) for k, v in params.items()}).path
    given = list(query.items() if isinstance(query, Mapping) else query or [])
    # A list is a repeated parameter (``status=dead&status=held``).
    expanded = [(k, item) for k, v in given for item in (v if isinstance(v, list) else [v])]
    pairs = [(k, str(v)) for k, v in expanded if v is not None and v != ""]
    return f"{path}?{urlencode(pairs)}" if pairs else path


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(_TEMPLATES),
        autoescape=True,
        finalize=_visible,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        duration=age,
        duration_text=duration,
        count=_count,
        first_line=_first_line,
        payload=payload_text,
        preview=payload_preview,
        timed=timed,
        when=moment,
    )
    env.globals["link"] = _link
    return env


templates = Jinja2Templates(env=_environment())


def wants_html(request: Request) -> bool:
    """Whether the request is a browser's, for a page rather than JSON."""
    return "text/html" in request.headers.get("accept", "")


def _csrf_token(request: Request) -> tuple[str, bool]:
    """The token the page's forms carry, and whether the cookie must be set (missing, or not
    one this console made)."""
    token = request.cookies.get(CSRF_COOKIE, "")
    if _TOKEN.fullmatch(token):
        return token, False
    return new_csrf_token(), True


def page(
    request: Request,
    principal: Principal | None,
    template: str,
    context: Mapping[str, Any],
    *,
    nav: str = "",
    refresh: bool = True,
    status_code: int = 200,
    headers: Mapping[str, str] | None = None,
) -> Response:
    """A page, or its main part alone when the request asks for a fragment; sets the CSRF
    cookie when the browser has none."""
    console = served_by(request)
    one = isinstance(console, Console)
    # The page of several databases has no form: it sets no cookie (the cookie of each
    # database's console is its own, under that console's path).
    token, fresh = _csrf_token(request) if principal is not None and one else ("", False)
    params = request.query_params
    full = {
        "request": request,
        "console_title": console.title,
        "many_databases": not one,
        "database_name": console.app.database_name if isinstance(console, Console) else None,
        "fleet_path": request.scope.get(FLEET_PATH),
        "principal": principal,
        "can_operate": principal is not None and principal.role.allows(Permission.OPERATE),
        "csrf_field": CSRF_FIELD,
        "csrf_token": token,
        "flash": params.get("flash", "")[:FLASH_SHOWN],
        "flash_level": "error" if params.get("level") == "error" else "ok",
        "refresh_seconds": console.refresh_seconds if refresh else 0,
        "fragment": request.headers.get(FRAGMENT_HEADER) == "1",
        "nav": nav,
        **context,
    }
    response = templates.TemplateResponse(
        request, template, full, status_code=status_code, headers={**_HEADERS, **(headers or {})}
    )
    if fresh:
        response.set_cookie(
            CSRF_COOKIE,
            token,
            path=request.scope.get("root_path") or "/",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
    return response


def error_page(request: Request, status: int, detail: str, headers: dict[str, str]) -> Response:
    """An error as a small page, its text escaped."""
    return page(
        request,
        None,
        "error.html",
        {"status": status, "detail": detail},
        refresh=False,
        status_code=status,
        headers=headers,
    )
