"""The commands of ``outbox``, by topic; importing a module registers its commands on ``main``.

The command group imports a module when one of its commands is asked for
(``outbox.cli._main.COMMAND_MODULES``), and every module for the help and for an unknown name.
"""

__all__ = [
    "archive",
    "clock",
    "dashboard",
    "demo",
    "fanout",
    "flags",
    "flow",
    "groups",
    "inbox",
    "notify",
    "run",
    "schema",
    "status",
    "work",
    "workers",
]
