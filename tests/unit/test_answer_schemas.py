"""The JSON Schema of the operations layer's answers, derived from their dataclasses
(``outbox.web._answer_schemas``): what ``jsonable`` writes, and nothing else."""

from __future__ import annotations

import datetime as dt
import enum
import uuid
from dataclasses import dataclass, field
from typing import Any

import jsonschema_rs
import pytest

from outbox._core.values import jsonable
from outbox.web import bodies, openapi
from outbox.web._answer_schemas import AnswerSchemas


class Colour(enum.StrEnum):
    RED = "red"
    BLUE = "blue"


class Shade(enum.StrEnum):
    DARK = "dark"
    RED = "red"


@dataclass(frozen=True)
class Part:
    """A part of a sample."""

    name: str


@dataclass(frozen=True)
class Sample:
    """A sample answer."""

    id: uuid.UUID
    tint: Colour | Shade
    parts: list[Part]
    pairs: list[tuple[Part, str]]
    counts: dict[Colour, int]
    at: dt.datetime | None
    data: bytes
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def size(self) -> int:
        """How many parts."""
        return len(self.parts)

    @property
    def _hidden(self) -> int:
        return 0


SAMPLE = Sample(
    id=uuid.UUID(int=1),
    tint=Shade.DARK,
    parts=[Part("a")],
    pairs=[(Part("b"), "why")],
    counts={Colour.RED: 2},
    at=dt.datetime(2026, 1, 2, 3, 4, 5),
    data=b"\x00\x01",
    extra={"deep": [1, {"x": None}]},
)


def _problems(schemas: AnswerSchemas, schema: dict[str, Any], value: Any) -> list[str]:
    document = {**schema, "components": {"schemas": schemas.schemas}}
    validator = jsonschema_rs.Draft202012Validator(document, validate_formats=True)
    return [f"{list(e.instance_path)}: {e.message}" for e in validator.iter_errors(value)]


def test_what_jsonable_writes_of_a_dataclass_is_what_its_schema_allows() -> None:
    """A dataclass's fields and public properties, each required, and nothing else."""
    schemas = AnswerSchemas()
    schema = schemas.of(Sample)
    written = jsonable(SAMPLE)
    assert ([], ["[]: Additional properties are not allowed ('more' was unexpected)"]) == (
        _problems(schemas, schema, written),
        _problems(schemas, schema, {**written, "more": 1}),
    )


def test_an_answer_lacking_a_property_is_refused() -> None:
    """``jsonable`` writes every property: one missing is not the answer described."""
    schemas = AnswerSchemas()
    schema = schemas.of(Sample)
    written = jsonable(SAMPLE)
    del written["size"]
    assert ['[]: "size" is a required property'] == _problems(schemas, schema, written)


def test_a_union_of_two_enums_is_one_enum_of_both_values() -> None:
    """msgspec describes no union of two enums: its values, once each, in one ``enum``."""
    schemas = AnswerSchemas()
    schemas.of(Sample)
    assert {"enum": ["blue", "dark", "red"]} == schemas.schemas["Sample"]["properties"]["tint"]


def test_a_pair_is_an_array_of_exactly_its_two_items() -> None:
    """``tuple[Part, str]``: two items, the first a part, the second text."""
    schemas = AnswerSchemas()
    schema = schemas.of(tuple[Part, str])
    assert ([], True, True) == (
        _problems(schemas, schema, [{"name": "a"}, "why"]),
        bool(_problems(schemas, schema, [{"name": "a"}, "why", "more"])),
        bool(_problems(schemas, schema, ["why", {"name": "a"}])),
    )


def test_a_type_jsonable_writes_only_as_text_is_refused_by_name() -> None:
    """No schema is guessed for a type ``jsonable`` falls back on ``str()`` for."""
    with pytest.raises(TypeError, match="complex"):
        AnswerSchemas().of(list[complex])


def test_two_types_of_one_name_are_refused() -> None:
    """Components are named by their type's name: two types of one name would share it."""
    other = dataclass(frozen=True)(type("Part", (), {"__annotations__": {"size": "int"}}))
    schemas = AnswerSchemas()
    schemas.of(Part)
    with pytest.raises(TypeError, match="named Part"):
        schemas.of(other)


def test_a_schema_the_document_names_twice_is_one_schema() -> None:
    """An enum both a body and an answer hold is described alike by msgspec and by the
    answers' schemas; a dataclass within a declared answer is described as jsonable writes
    it."""
    _, asked = bodies.components(list(bodies.REQUESTS))
    _, answered = bodies.components(bodies.ANSWERS)
    described = openapi.spec()["components"]["schemas"]
    twice = sorted(set(openapi._ANSWERS.schemas) & {*asked, *answered})
    enums = ["GroupStatus", "IngestResult"]
    assert (
        [*enums, "Ingested"],
        [asked.get(name, answered.get(name)) for name in enums],
        False,
    ) == (
        twice,
        [described[name] for name in enums],
        described["Ingested"]["additionalProperties"],
    )
