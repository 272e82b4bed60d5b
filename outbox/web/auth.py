"""Who is asking, and what they may do: bearer tokens, basic auth, the host application's own
hook, and, on loopback only and only when asked for, nobody at all.

Roles, each allowed what the one before it is: ``viewer`` reads every page and endpoint;
``operator`` also pauses and resumes handlers, replays, edits, discards and releases groups;
``admin`` also writes events (ingest). ``producer`` only writes events: the role of a token a
service outside Python is given. Secrets are compared in constant time, and never shown.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
import os
import secrets
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from starlette.requests import HTTPConnection

from outbox.exceptions import ConfigurationError

__all__ = [
    "CSRF_COOKIE",
    "CSRF_FIELD",
    "CSRF_HEADER",
    "TOKENS_ENV",
    "USERS_ENV",
    "Auth",
    "Permission",
    "Principal",
    "Role",
    "is_loopback",
]

TOKENS_ENV = "OUTBOX_WEB_TOKENS"
"""Bearer tokens: ``name:role:token`` entries, separated by commas."""
USERS_ENV = "OUTBOX_WEB_USERS"
"""Basic-auth users: ``name:role:password`` entries, separated by commas."""
CSRF_COOKIE = "outbox_csrf"
CSRF_HEADER = "X-CSRF-Token"
CSRF_FIELD = "csrf_token"


class Permission(StrEnum):
    """What a request does."""

    READ = "read"
    OPERATE = "operate"
    INGEST = "ingest"


class Role(StrEnum):
    """What a principal may do (see the module's docstring)."""

    VIEWER = "viewer"
    OPERATOR = "operator"
    ADMIN = "admin"
    PRODUCER = "producer"

    def allows(self, permission: Permission) -> bool:
        """Whether this role may do ``permission``."""
        return permission in _ALLOWED[self]


_ALLOWED = {
    Role.VIEWER: {Permission.READ},
    Role.OPERATOR: {Permission.READ, Permission.OPERATE},
    Role.ADMIN: {Permission.READ, Permission.OPERATE, Permission.INGEST},
    Role.PRODUCER: {Permission.INGEST},
}


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a request comes from: a name (recorded with every write) and a role."""

    name: str
    role: Role
    via: str = "token"
    """How it was authenticated: ``token`` (a bearer token), ``basic``, ``hook`` or
    ``loopback``. Every write authenticated by something a browser sends by itself (all but
    ``token``) must carry the page's CSRF token."""


Hook = Callable[[HTTPConnection], "Principal | Awaitable[Principal | None] | None"]


@dataclass(frozen=True)
class Auth:
    """How the dashboard and the API authenticate.

    ``tokens``: bearer token -> principal; ``users``: basic-auth name -> (password, role);
    ``hook``: the host application's own (a function of the request, sync or async, that
    returns a :class:`Principal` or None); ``loopback_role``: a role given to unauthenticated
    requests from this machine's loopback addresses only (``127.0.0.0/8``, ``::1``), never to
    others: for a dashboard on a laptop. With none of them, nothing is served.
    """

    tokens: Mapping[str, Principal] = field(default_factory=dict)
    users: Mapping[str, tuple[str, Role]] = field(default_factory=dict)
    hook: Hook | None = None
    loopback_role: Role | None = None

    def __post_init__(self) -> None:
        for token, principal in self.tokens.items():
            if not isinstance(token, str) or len(token) < 16:
                raise ConfigurationError(
                    f"tokens: the token of {getattr(principal, 'name', principal)!r} is shorter "
                    "than 16 characters"
                )
            if not isinstance(principal, Principal):
                raise ConfigurationError("tokens: expected token -> Principal")
        for name, entry in self.users.items():
            if not (isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[1], Role)):
                raise ConfigurationError(f"users: {name!r}: expected (password, Role)")
            if len(entry[0]) < 8:
                raise ConfigurationError(f"users: the password of {name!r} is shorter than 8")
        if self.loopback_role is not None and not isinstance(self.loopback_role, Role):
            raise ConfigurationError("loopback_role: expected a Role")
        if not (self.tokens or self.users or self.hook or self.loopback_role):
            raise ConfigurationError(
                "auth: no way to authenticate: give tokens, users or a hook (or a "
                "loopback_role, for a dashboard reached from this machine only)"
            )

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, *, loopback_role: Role | None = None
    ) -> Auth:
        """Tokens from ``OUTBOX_WEB_TOKENS`` and users from ``OUTBOX_WEB_USERS`` (``name:role:
        secret`` entries separated by commas)."""
        environ = os.environ if environ is None else environ
        tokens = {
            secret: Principal(name, role)
            for name, role, secret in _entries(environ.get(TOKENS_ENV, ""), TOKENS_ENV)
        }
        users = {
            name: (secret, role)
            for name, role, secret in _entries(environ.get(USERS_ENV, ""), USERS_ENV)
        }
        return cls(tokens=tokens, users=users, loopback_role=loopback_role)

    async def principal(self, connection: HTTPConnection) -> Principal | None:
        """Who ``connection`` comes from; None when it proves nobody."""
        header = connection.headers.get("authorization", "")
        scheme, _, credentials = header.partition(" ")
        if scheme.lower() == "bearer" and credentials:
            return _by_token(self.tokens, credentials.strip())
        if scheme.lower() == "basic" and credentials:
            return _by_password(self.users, credentials.strip())
        if self.hook is not None:
            found = self.hook(connection)
            if isinstance(found, Awaitable):
                found = await found
            if found is not None:
                if not isinstance(found, Principal):
                    raise TypeError(f"auth hook returned {type(found).__name__}, not a Principal")
                return Principal(found.name, found.role, "hook")
        client = connection.client
        if self.loopback_role is not None and client is not None and is_loopback(client.host):
            return Principal(f"anonymous@{client.host}", self.loopback_role, "loopback")
        return None

    @property
    def asks_for_basic(self) -> bool:
        """Whether a refused browser should be asked for a name and password."""
        return bool(self.users)


def _entries(text: str, variable: str) -> list[tuple[str, Role, str]]:
    found = []
    for entry in filter(None, (e.strip() for e in text.split(","))):
        name, _, rest = entry.partition(":")
        role, _, secret = rest.partition(":")
        if not name or not secret or role not in Role.__members__.values():
            raise ConfigurationError(
                f"{variable}: expected name:role:secret entries (role one of "
                f"{', '.join(Role)}), got {name or '?'}:{role or '?'}:…"
            )
        found.append((name, Role(role), secret))
    return found


def _by_token(tokens: Mapping[str, Principal], given: str) -> Principal | None:
    # Every token is compared, so that the time taken says nothing about which one matched.
    found = None
    for token, principal in tokens.items():
        if hmac.compare_digest(token.encode(), given.encode()):
            found = principal
    return found


def _by_password(users: Mapping[str, tuple[str, Role]], credentials: str) -> Principal | None:
    try:
        name, _, password = base64.b64decode(credentials, validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None
    found = None
    for user, (secret, role) in users.items():
        same_name = hmac.compare_digest(user.encode(), name.encode())
        if hmac.compare_digest(secret.encode(), password.encode()) and same_name:
            found = Principal(user, role, "basic")
    return found


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (a name is not: it could resolve anywhere)."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def new_csrf_token() -> str:
    """A fresh CSRF token for a browser's cookie."""
    return secrets.token_urlsafe(32)
