"""outbox's engines read JSON as ``json.loads`` does, whatever form the driver hands it in."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from outbox._db.engine import _load_json

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4)
    ),
    max_leaves=12,
)


def texts(value: Any) -> list[str]:
    """The ways a database may give ``value`` back as JSON text: compact, spaced, indented,
    with its non-ASCII characters as they are or escaped."""
    return [
        json.dumps(value, separators=(",", ":"), ensure_ascii=False),
        json.dumps(value),
        " " + json.dumps(value, indent=2, ensure_ascii=False) + "\n",
    ]


@given(JSON_VALUES)
def test_utf8_bytes_load_as_json_loads_loads_them(value: Any) -> None:
    """UTF-8 bytes (psycopg's form) give what json.loads gives."""
    for text in texts(value):
        assert json.loads(text.encode()) == _load_json(text.encode())


@given(JSON_VALUES)
def test_text_loads_as_json_loads_loads_it(value: Any) -> None:
    """Text (SQLite's and MariaDB's form) gives what json.loads gives."""
    for text in texts(value):
        assert json.loads(text) == _load_json(text)


@given(JSON_VALUES)
def test_values_are_json_loads_values_type_for_type(value: Any) -> None:
    """Each value has the type json.loads gives it (1 and 1.0 are equal, but not the same)."""
    for text in texts(value):
        assert repr(json.loads(text)) == repr(_load_json(text.encode())) == repr(_load_json(text))


@pytest.mark.parametrize(
    "text",
    ["", "{", '{"a": 1} {"b": 2}', "nul", b"[1,", "\ufeff{}", "[1] x", " ", "1 2", '"a" ,'],
)
def test_what_json_loads_refuses_is_refused(text: str | bytes) -> None:
    """Text that is not one JSON document raises json.loads' error, with its message and
    position."""
    with pytest.raises(json.JSONDecodeError) as refused:
        _load_json(text)
    if isinstance(text, str) and not text.startswith("\ufeff"):
        with pytest.raises(json.JSONDecodeError) as expected:
            json.loads(text)
        assert (expected.value.msg, expected.value.pos) == (refused.value.msg, refused.value.pos)


@pytest.mark.parametrize("text", ["NaN", "-Infinity", " [1]", "[1] ", "\t{}\n", '"é"', "1e400"])
def test_documents_with_whitespace_or_constants_load_as_json_loads_loads_them(text: str) -> None:
    """Whitespace around a document, and the constants json.loads accepts, read the same."""
    assert repr(json.loads(text)) == repr(_load_json(text)) == repr(_load_json(text.encode()))


@pytest.mark.parametrize("value", [0.5, 3, None, bytearray(b"[1]")])
def test_what_is_not_str_or_bytes_goes_to_json_loads(value: object) -> None:
    """A value in another form (SQLite's REAL in a JSON column) gets json.loads' own answer."""
    try:
        expected: object = json.loads(value)  # type: ignore[arg-type]
    except TypeError as error:
        expected = repr(error)
    try:
        actual: object = _load_json(value)  # type: ignore[arg-type]
    except TypeError as error:
        actual = repr(error)
    assert expected == actual
