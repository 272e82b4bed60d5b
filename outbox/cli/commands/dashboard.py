"""``outbox dashboard``: the operators' console (pages and API) served on its own."""

from __future__ import annotations

import os

import click

from outbox.cli._context import Context
from outbox.cli._errors import EXIT_USAGE, command, fail, ready
from outbox.cli._main import main

ROLES = ("viewer", "operator", "admin")


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="The address to listen on.")
@click.option(
    "--port", default=8000, show_default=True, type=click.IntRange(0, 65535), help="The port."
)
@click.option(
    "--loopback-role",
    type=click.Choice(ROLES),
    default=None,
    help=(
        "Let unauthenticated requests from this machine in, with this role (only with a "
        "loopback --host; requests from elsewhere still need credentials)."
    ),
)
@click.option(
    "--refresh",
    default=5.0,
    show_default=True,
    type=click.FloatRange(0.5, 3600),
    help="Seconds between the pages' refreshes (and the status they share).",
)
@click.option(
    "--hide-payloads",
    "hidden",
    multiple=True,
    metavar="HANDLER",
    help="Never show the values of this handler's events (repeatable).",
)
@command
def dashboard(
    ctx: Context,
    host: str,
    port: int,
    loopback_role: str | None,
    refresh: float,
    hidden: tuple[str, ...],
) -> None:
    """Serve the dashboard and the HTTP API (the web extra).

    Of an application serving several databases: a page of every database at /, and each
    database's console under /databases/NAME/ (with --database NAME, that database's alone).

    Credentials come from OUTBOX_WEB_TOKENS and OUTBOX_WEB_USERS (name:role:secret entries,
    separated by commas; roles viewer, operator, admin, producer). Without any, it serves
    nothing unless --loopback-role lets this machine in.
    """
    try:
        import uvicorn

        from outbox.web import create_app
        from outbox.web.auth import Auth, Role, is_loopback
    except ImportError as error:
        fail(
            f"the dashboard needs the web extra ({error.name} is missing): "
            "pip install 'sqlalchemy-outbox[web]'",
            EXIT_USAGE,
        )
    if loopback_role is not None and not is_loopback(host):
        fail(
            f"--loopback-role serves without credentials: only with a loopback --host "
            f"(127.0.0.1 or ::1), not {host}",
            EXIT_USAGE,
        )
    from outbox.web.auth import TOKENS_ENV, USERS_ENV

    role = None if loopback_role is None else Role(loopback_role)
    if role is None and not (os.environ.get(TOKENS_ENV) or os.environ.get(USERS_ENV)):
        fail(
            f"the dashboard serves nobody without credentials: set {TOKENS_ENV} or {USERS_ENV} "
            "(name:role:secret, comma-separated), or --loopback-role for this machine only",
            EXIT_USAGE,
        )
    auth = Auth.from_env(loopback_role=role)
    app = ctx.app()
    if app.serves_many:
        # Not checked first: a database that is down or not migrated shows its error in its
        # line of the console, and does not keep the others' consoles from being served.
        listed = ", ".join(app.databases()) or "none listed now"
        said = f"databases: {listed}; each at /databases/NAME/"
    else:
        ready(app)
        said = "API: /api/v1, /healthz, /metrics"
    console = create_app(app, auth=auth, refresh_seconds=refresh, hide_payloads=hidden)
    click.echo(f"outbox dashboard on http://{host}:{port}/ ({said})")
    uvicorn.run(console, host=host, port=port, log_level="warning", access_log=False)
