"""The API's request bodies and the answers it builds itself, each declared once (msgspec
structs): an endpoint reads its body with :func:`read` (a 400 naming the field otherwise), and
the OpenAPI document (:mod:`outbox.web.openapi`) is made of the same declarations
(:func:`components`).

What the operations layer answers (``groups.Listing``, ``archive.ArchivePage``...) is its own
dataclasses, as ``jsonable`` writes them (described by :mod:`outbox.web._answer_schemas`), and
so is an answer made of them (:class:`Statuses`); what a buffer's columns take is declared per
handler when the console is made (:mod:`outbox.web._ingest_bodies`).
"""

from __future__ import annotations

import dataclasses
import re
import uuid
from collections.abc import Sequence
from enum import StrEnum
from typing import Annotated, Any, TypeAlias, TypeVar

import msgspec
from starlette.exceptions import HTTPException

from outbox._core.checks import MAX_WAIT_SECONDS, quoted
from outbox.ops.ingest import MAX_EVENTS, MAX_KEY_LENGTH
from outbox.ops.ingest import Ingested as Ingested  # an answer: the dataclass declares it
from outbox.ops.metrics import HandlerStatus
from outbox.ops.selection import MAX_AGE_SECONDS
from outbox.schema import GroupStatus, WorkerRequest

S = TypeVar("S", bound=msgspec.Struct)
MAX_MESSAGE = 300
"""The longest problem a 400 quotes from a body (an enum value or a field's name can be long)."""


def json_value(depth: int = 3) -> dict[str, Any]:
    """The JSON Schema of any JSON value, nested ``depth`` levels (outbox takes deeper: up to
    ``outbox._core.checks.MAX_JSON_DEPTH``; the document says what every request may hold)."""
    scalars: list[dict[str, Any]] = [
        {"type": "null"},
        {"type": "boolean"},
        {"type": "number"},
        {"type": "string"},
    ]
    if depth == 0:
        return {"anyOf": scalars}
    inner = json_value(depth - 1)
    return {
        "anyOf": [
            *scalars,
            {"type": "array", "items": inner},
            {"type": "object", "propertyNames": {"type": "string"}, "additionalProperties": inner},
        ]
    }


JSON_VALUE = json_value()
TEXT_PATTERN = r"\S"
"""Some text, not only spaces."""

# A number is an int or a float, each kept as given: an answer that repeats it says 5, not 5.0.
Age: TypeAlias = (
    Annotated[int, msgspec.Meta(ge=0, le=int(MAX_AGE_SECONDS))]
    | Annotated[float, msgspec.Meta(ge=0, le=MAX_AGE_SECONDS)]
)
Wait: TypeAlias = (
    Annotated[int, msgspec.Meta(gt=0, le=int(MAX_WAIT_SECONDS))]
    | Annotated[float, msgspec.Meta(gt=0, le=MAX_WAIT_SECONDS)]
)
Text = Annotated[str, msgspec.Meta(min_length=1, pattern=TEXT_PATTERN)]
Key = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_KEY_LENGTH)]
Values = Annotated[
    dict[str, Annotated[Any, msgspec.Meta(extra_json_schema=JSON_VALUE)]],
    msgspec.Meta(
        description="column values by column name",
        extra_json_schema={"propertyNames": {"type": "string"}},
    ),
]


class Body(msgspec.Struct, forbid_unknown_fields=True):
    """A request body: a JSON object of these fields and no other."""


# --- request bodies ------------------------------------------------------------------------


class DryRun(Body):
    """``dry_run``: say what would be done, and do nothing."""

    dry_run: bool | None = None


class SelectionBody(Body):
    """A selection of groups (each field narrows it; at least one is given) and ``dry_run``."""

    handler: Annotated[list[str], msgspec.Meta(min_length=1)] | None = None
    status: Annotated[list[GroupStatus], msgspec.Meta(min_length=1)] | None = None
    older_than: Age | None = None
    error: Text | None = None
    key: Text | None = None
    payload: Text | None = None
    group: Annotated[list[uuid.UUID], msgspec.Meta(min_length=1)] | None = None
    dry_run: bool | None = None


class DiscardBody(SelectionBody):
    """A selection of groups to discard, ``dry_run``, and why (``reason``)."""

    reason: Text | None = None


class EditBody(Body):
    """The columns of an event to change, and their values."""

    values: Annotated[Values, msgspec.Meta(min_length=1)]


class PauseBody(Body):
    """How long a pause lasts (``seconds``; without: until resumed), and why."""

    seconds: Wait | None = None
    reason: str | None = None


class ReleaseRefusedBody(Body):
    """Only the refused groups of ``handler``, or only ``group_id``."""

    handler: str | None = None
    group_id: uuid.UUID | None = None


class ReleaseHeldBody(ReleaseRefusedBody):
    """Only the held keys of ``handler``, only ``key``, or only those of ``group_id``."""

    key: str | None = None


class Nothing(Body):
    """An empty body (or none)."""


class IngestEvent(Body):
    """One event of a batch: its idempotency key, and its values."""

    key: Key
    values: Values


class IngestBatch(Body):
    """A batch of events, written all or nothing."""

    events: Annotated[list[IngestEvent], msgspec.Meta(min_length=1, max_length=MAX_EVENTS)]


REQUESTS: tuple[type[Body], ...] = (
    DryRun,
    SelectionBody,
    DiscardBody,
    EditBody,
    PauseBody,
    ReleaseRefusedBody,
    ReleaseHeldBody,
    IngestBatch,
)
"""The request bodies the document names."""


# --- answers ---------------------------------------------------------------------------------


class Answer(msgspec.Struct):
    """An answer the API builds itself (its fields in the order it writes them)."""


class Error(Answer):
    """What is wrong, in one line."""

    error: str


class Paused(Answer):
    """A handler paused: for how long (``seconds``; None: until resumed), and why."""

    handler: str
    paused: bool
    seconds: int | float | None
    reason: str


class Resumed(Answer):
    """A handler's pause ended; whether it was paused."""

    handler: str
    paused: bool
    was_paused: bool


class WorkerAsked(Answer):
    """The worker asked, and within how many seconds it acts."""

    worker: str
    hostname: str
    pid: int
    request: WorkerRequest
    acts_within: float


class Released(Answer):
    """How many were released."""

    released: int


class Written(Answer):
    """A batch written: how many events now, how many written before, and each event."""

    written: int
    duplicates: int
    events: list[Ingested]


class Conflict(Answer):
    """A batch refused for keys sent before with other values: nothing written; each event's
    result."""

    error: str
    events: list[Ingested]


@dataclasses.dataclass(frozen=True, slots=True)
class Statuses:
    """Every handler's status, and when it was read (``time.time()``). A dataclass, not a
    struct: ``jsonable`` writes each status with its properties, as ``outbox status --json``
    does."""

    taken_at: float
    handlers: list[HandlerStatus]


class DatabaseRead(StrEnum):
    """How a database's line of the console of several databases was read."""

    ANSWERED = "answered"
    """Its numbers are its console's latest status snapshot."""
    FAILED = "failed"
    """Its last read failed (``error`` says why); its numbers, if any, are from its last read
    that did not."""
    WAITING = "waiting"
    """It did not answer within the wait; its numbers, if any, are from its last read."""


class Totals(Answer):
    """Every handler of a database taken together, or every database: counts summed, ages
    and staleness the largest. ``at_least``: a count reached the cap it was counted to."""

    unclaimed: int
    oldest_age: float | None
    staleness: float | None
    groups_in_flight: int
    groups_retrying: int
    groups_refused: int
    dead: int
    alerts: int
    workers_alive: int | None
    at_least: bool


class DatabaseStatus(Answer):
    """One database of an application serving several: how it was read, why not (``error``,
    one line), when its numbers were read (``taken_at``, ``time.time()``; None: never), and
    its numbers (None: none read yet)."""

    name: str
    read: DatabaseRead
    error: str | None
    taken_at: float | None
    totals: Totals | None


class DatabasesStatus(Answer):
    """Every database the registry lists now, and all of them taken together (``total``:
    those of ``counted`` databases whose numbers are known); ``registry_error``: why the
    registry's last read failed (the databases are then those of its last good read)."""

    taken_at: float
    databases: list[DatabaseStatus]
    total: Totals
    counted: int
    registry_error: str | None


ANSWERS: tuple[type[Any], ...] = (
    Error,
    Paused,
    Resumed,
    WorkerAsked,
    Released,
    Written,
    Conflict,
    Ingested,
)
"""The answers the document names."""
DATABASES_ANSWERS: tuple[type[Any], ...] = (Error, DatabasesStatus)
"""The answers the document of the console of several databases names."""


def components(
    declared: Sequence[Any], template: str = "#/components/schemas/{name}"
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The JSON Schema of each of ``declared`` (a reference each) and the schemas they refer
    to, by name, as the document's ``components`` holds them."""
    refs, schemas = msgspec.json.schema_components(declared, ref_template=template)
    return list(refs), schemas


# --- reading ---------------------------------------------------------------------------------


def read(given: dict[str, Any], kind: type[S]) -> S:
    """``given`` (a JSON object as ``json.loads`` made it) as a ``kind``: a 400 naming the
    field otherwise, in one line."""
    declared = kind.__struct_encode_fields__
    unknown = sorted(set(given) - set(declared))
    if unknown:
        raise HTTPException(
            400, f"unknown field {quoted(unknown[0])}; expected some of {', '.join(declared)}"
        )
    try:
        return msgspec.convert(given, kind)
    except msgspec.ValidationError as error:
        raise HTTPException(400, problem(error)) from None


_MISSING = re.compile(r"^Object missing required field `(?P<name>.*)`$", re.DOTALL)


def problem(error: msgspec.ValidationError) -> str:
    """msgspec's ``Expected `str`, got `int` - at `$.events[0].key``` as outbox says it:
    ``events[0].key: expected str, got int``; a missing field as ``name: a value is required``;
    cut at :data:`MAX_MESSAGE` characters."""
    message, _, path = str(error).partition(" - at `$")
    where = path.removesuffix("`").removeprefix(".")
    missing = _MISSING.match(message)
    if missing is not None:
        where = f"{where}.{missing['name']}" if where else missing["name"]
        message = "a value is required"
    text = f"{where or 'body'}: {message[:1].lower()}{message[1:].replace('`', '')}"
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 3] + "..."
