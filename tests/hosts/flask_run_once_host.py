"""A Flask application with a command that runs the shop's outbox once, for cron:
``flask --app tests.hosts.flask_run_once_host outbox-run --every 60``. It prints the result as
one JSON line and exits 1 when groups were dead-lettered or held as refused."""

from __future__ import annotations

import json

import click
from flask import Flask

import outbox
from outbox import jsonable
from tests.hosts import shop

app = Flask(__name__)


@app.cli.command("outbox-run")
@click.option("--every", type=float, default=None, help="The schedule's tick in seconds.")
def outbox_run(every: float | None) -> None:
    """Rescue, distribute and run what is due, once."""
    result = outbox.run_once(shop.outbox, every=every)
    click.echo(json.dumps(jsonable(result)))
    if result.needs_operator:
        raise SystemExit(1)
