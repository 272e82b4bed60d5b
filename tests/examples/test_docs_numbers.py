"""The numbers the docs give for this release's migrations and schema generation are the code's.

Each pattern below finds a statement of the docs that names the newest migration this outbox
ships, or the schema generation its workers understand, for this release (``outbox 0.2`` while
the version is 0.2.x); every one must be found at least once, so that a reworded sentence is
looked at again rather than left unchecked.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from outbox import schema
from outbox._core.version import VERSION
from outbox.ops.migrate import known_revisions

DOCS = Path(__file__).resolve().parents[2] / "docs"
RELEASE = ".".join(VERSION.split(".")[:2])
NEWEST = known_revisions()[-1]

# (what it states, pattern: group "release" is the outbox version it speaks of, group "number"
# the number it gives, what the number must be)
STATEMENTS = [
    (
        "the migrations a release ships",
        r"(?P<release>\d+\.\d+) \(ships 0001 to (?P<number>\d{4})\)",
        NEWEST,
    ),
    (
        "the generation a release's workers understand",
        r"the newest migration it ships: (?P<number>\d+) for outbox (?P<release>\d+\.\d+)",
        str(schema.GENERATION),
    ),
    (
        "the generation in a worker's refusal",
        r"this worker \(outbox (?P<release>\d+\.\d+)\.\d+\) understands generation (?P<number>\d+)",
        str(schema.GENERATION),
    ),
    (
        "the generation in a refusal of older tables",
        r"and outbox (?P<release>\d+\.\d+)\.\d+ needs generation (?P<number>\d+)",
        str(schema.GENERATION),
    ),
    (
        "the generation in `outbox status`",
        r"schema generation (?P<number>\d+) \(workers from generation \d+\), migrated by "
        r"outbox (?P<release>\d+\.\d+)\.\d+",
        str(schema.GENERATION),
    ),
    (
        "the newest revision a release knows, in its refusal of newer tables",
        r"newer than this outbox knows \(newest (?P<number>\d{4})\)(?P<release>)",
        NEWEST,
    ),
    (
        "the revision to downgrade a newer release's tables to",
        r"Downgrade with the \*newer\* outbox first: `outbox migrate --to (?P<number>\d{4})`"
        r"(?P<release>)",
        NEWEST,
    ),
]


def _docs_text() -> str:
    pages = sorted(DOCS.glob("*.md")) + sorted(DOCS.glob("sinks/*.md"))
    return "\n".join(" ".join(page.read_text(encoding="utf-8").split()) for page in pages)


@pytest.mark.parametrize(
    ("pattern", "expected"), [(p, e) for _, p, e in STATEMENTS], ids=[s for s, _, _ in STATEMENTS]
)
def test_the_docs_give_this_releases_migrations_and_generation_as_the_code_does(
    pattern: str, expected: str
) -> None:
    """Each such statement about this release gives the code's number, and one is found."""
    found = [
        m["number"] for m in re.finditer(pattern, _docs_text()) if m["release"] in ("", RELEASE)
    ]
    assert (True, [expected] * len(found)) == (bool(found), found)
