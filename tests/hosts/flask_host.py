"""A Flask application whose logging is set up as Flask's documentation shows, with an
endpoint that runs the shop's outbox (``POST /run-outbox``).

outbox is imported before the logging configuration runs, as it is in many applications:
``dictConfig`` disables the loggers that exist at that moment, and outbox's must not be
among them.
"""

from __future__ import annotations

from logging.config import dictConfig

from flask import Flask

from tests.hosts import shop

# Flask's documentation, "Logging", "Basic Configuration", as it stands.
dictConfig(
    {
        "version": 1,
        "formatters": {
            "default": {"format": "[%(asctime)s] %(levelname)s in %(module)s: %(message)s"}
        },
        "handlers": {
            "wsgi": {
                "class": "logging.StreamHandler",
                "stream": "ext://flask.logging.wsgi_errors_stream",
                "formatter": "default",
            }
        },
        "root": {"level": "INFO", "handlers": ["wsgi"]},
    }
)

app = Flask(__name__)


@app.post("/run-outbox")
def run_outbox() -> dict[str, int]:
    """Handle the shop's events that are due now."""
    return shop.run_burst()
