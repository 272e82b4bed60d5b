"""The operations layer: the levers and readings the three faces (the command line, the console's
pages and the HTTP API) share.

Each face builds the same values here (a :class:`~outbox.ops.selection.Selection`, an operator's
name, a :class:`~outbox.ops.progress.Progress`) and asks the same functions, so that a lever
pulled from the console does what the command does. The modules here may use the database
layer, the engine and the services; no face reaches past them (``tests/unit/test_layering.py``).
"""
