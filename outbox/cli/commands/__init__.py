"""The commands of ``outbox``, by topic; importing a module registers its commands on ``main``."""

from outbox.cli.commands import (
    archive,
    clock,
    dashboard,
    demo,
    flow,
    groups,
    notify,
    run,
    schema,
    status,
    work,
    workers,
)

__all__ = [
    "archive",
    "clock",
    "dashboard",
    "demo",
    "flow",
    "groups",
    "notify",
    "run",
    "schema",
    "status",
    "work",
    "workers",
]
