"""What the dashboard's tests share: credentials, a buffer of hostile values, and reading the
numbers a page shows (each in a ``data-value`` attribute, next to its ``data-field``)."""

from __future__ import annotations

import base64
from html.parser import HTMLParser
from typing import Any

from sqlalchemy import JSON, LargeBinary, String, Text, create_engine
from sqlalchemy.dialects import mysql
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from outbox import BufferMixin
from outbox.web import Auth, Principal, Role

OPERATOR_TOKEN = "operator-token-0123456789"
VIEWER_TOKEN = "viewer-token-0123456789"
USERS = {"olga": ("olga-password", Role.OPERATOR), "vic": ("vic-password", Role.VIEWER)}
AUTH = Auth(
    tokens={
        OPERATOR_TOKEN: Principal("ops-bot", Role.OPERATOR),
        VIEWER_TOKEN: Principal("view-bot", Role.VIEWER),
    },
    users=USERS,
)


def basic(name: str) -> dict[str, str]:
    """The headers of a browser that logged in as ``name`` (one of :data:`USERS`)."""
    credentials = f"{name}:{USERS[name][0]}".encode()
    return {"Authorization": "Basic " + base64.b64encode(credentials).decode()}


OPERATOR = basic("olga")
VIEWER = basic("vic")


class HostileBase(DeclarativeBase):
    pass


class HostileEvent(BufferMixin, HostileBase):
    """Values made to break a page: markup, long text, bytes, invisible characters."""

    __tablename__ = "test_hostile_events"
    label: Mapped[str] = mapped_column(String(200))
    body: Mapped[str | None] = mapped_column(
        Text().with_variant(mysql.MEDIUMTEXT(), "mysql", "mariadb"), nullable=True
    )
    blob: Mapped[bytes | None] = mapped_column(
        LargeBinary().with_variant(mysql.MEDIUMBLOB(), "mysql", "mariadb"), nullable=True
    )
    data: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)


def create_hostile_table(url: str) -> None:
    """Drop and create :class:`HostileEvent`'s buffer."""
    engine = create_engine(url)
    with engine.begin() as conn:
        HostileBase.metadata.drop_all(conn)
        HostileBase.metadata.create_all(conn)
    engine.dispose()


class _Values(HTMLParser):
    """Every ``data-field``/``data-value`` pair of a page, under the row (``data-<row>``) it is
    in."""

    def __init__(self, row: str) -> None:
        super().__init__()
        self.row = f"data-{row}"
        self.current = ""
        self.found: dict[str, dict[str, str]] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        given = dict(attrs)
        if tag == "tr" and self.row in given:
            self.current = given[self.row] or ""
        field, value = given.get("data-field"), given.get("data-value")
        if field is not None and value is not None:
            self.found.setdefault(self.current, {})[field] = value


def values(html: str, row: str = "handler") -> dict[str, dict[str, str]]:
    """The numbers a page shows, by row (the value of its ``data-<row>``; ``""``: outside any
    such row) and field."""
    parser = _Values(row)
    parser.feed(html)
    return parser.found


class _Attributes(HTMLParser):
    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name
        self.found: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        value = dict(attrs).get(self.name)
        if value is not None:
            self.found.append(value)


def attributes(html: str, name: str) -> list[str]:
    """The values of every ``name`` attribute in a page, in order."""
    parser = _Attributes(name)
    parser.feed(html)
    return parser.found


class _Pairs(HTMLParser):
    def __init__(self, key: str, value: str) -> None:
        super().__init__()
        self.key, self.value = key, value
        self.found: dict[str, str] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        given = dict(attrs)
        key, value = given.get(self.key), given.get(self.value)
        if key is not None and value is not None:
            self.found[key] = value


def pairs(html: str, key: str, value: str = "data-value") -> dict[str, str]:
    """``key`` attribute -> ``value`` attribute of every element of a page that has both."""
    parser = _Pairs(key, value)
    parser.feed(html)
    return parser.found
