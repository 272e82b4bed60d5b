"""The application the model tier runs through real ``outbox work`` processes.

``outbox --app tests.model.model_app:app --database-url URL work ...`` loads it. Its handler
plays the case in ``OUTBOX_MODEL_CASE`` (JSON, :func:`tests.model._behaviour.case_to_json`);
each process numbers its own calls through the script, so a case's calls are shared out among
the processes. Every call is recorded twice, as one JSON line each in
``<OUTBOX_MODEL_RECORDS>/<pid>.jsonl``, flushed at once: when it starts (so that a call its
process was killed in is known) and when it ends.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from outbox import Outbox, Settings
from tests.model._behaviour import Script, case_from_json, record_to_json, register
from tests.model._model import Record

CASE_ENV = "OUTBOX_MODEL_CASE"
RECORDS_ENV = "OUTBOX_MODEL_RECORDS"

# Dead workers are noticed within a few seconds, their groups rescued at once.
SETTINGS = Settings(rescue_interval=0.5, worker_stale_after=3.0)


def _sink(directory: Path) -> Callable[[Record], None]:
    path = directory / f"{os.getpid()}.jsonl"

    def write(record: Record) -> None:
        with path.open("a", encoding="utf-8") as out:
            out.write(record_to_json(record) + "\n")

    return write


app = Outbox(settings=SETTINGS)
if os.environ.get(CASE_ENV):
    _case = case_from_json(os.environ[CASE_ENV])
    register(app, _case, Script(_case.calls, _sink(Path(os.environ[RECORDS_ENV]))))
