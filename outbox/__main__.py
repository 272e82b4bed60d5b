"""``python -m outbox``: the same as the ``outbox`` command."""

from outbox.cli import main

main()
