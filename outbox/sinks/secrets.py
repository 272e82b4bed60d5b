"""The secrets a sink holds (passwords, tokens, header values), and their masking out of every
message a sink raises or logs: a downstream's error or answer often quotes what it was sent.

A secret is masked whole and by its parts: a header ``Bearer <token>`` masks ``<token>``
alone too (an API may echo the token without the scheme), basic auth's ``Basic <base64>``
masks the base64, ``user:password`` and the password, and a URL masks its password and its
query values, as written and percent-decoded. A part shorter than :data:`PART_MIN_CHARS` is
not masked alone, so that the scheme word ``Bearer`` is not masked everywhere; the whole value
always is, from :data:`SECRET_MIN_CHARS` characters.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import re
import traceback
from collections.abc import Iterable, Iterator
from urllib.parse import parse_qsl, unquote, urlsplit

from outbox.exceptions import DownstreamError
from outbox.retry import RetryAfter

MASK = "***"

SECRET_MIN_CHARS = 3
"""The shortest secret masked: shorter ones would mask ordinary text too."""
PART_MIN_CHARS = 8
"""The shortest part of a header's value masked alone (the token after ``Bearer``, a cookie's
value): the scheme words (``Bearer``, ``Basic``, ``Token``, ``Digest``) are shorter, and stay
readable."""

# What separates a header value's parts: spaces (``Bearer <token>``), commas (a Digest
# header's parameters), semicolons (cookies).
_PART_SEPARATORS = re.compile(r"[\s,;]+")


class Secrets:
    """The secret strings a sink holds, masked out of every message it raises or logs."""

    def __init__(self, values: Iterable[str | None] = ()) -> None:
        # Replaced whole, never changed in place: a sink learns a secret in one thread while
        # another masks with what it knew.
        self._values: tuple[str, ...] = ()
        for value in values:
            self.add(value)

    def add(self, value: str | bytes | None) -> None:
        """Mask ``value`` from now on (values of fewer than :data:`SECRET_MIN_CHARS`
        characters are not masked: they would mask ordinary text too)."""
        text = value.decode(errors="replace") if isinstance(value, bytes) else value
        if text and len(text) >= SECRET_MIN_CHARS and text not in self._values:
            # The longest first: a secret that holds another is masked whole.
            self._values = tuple(sorted((*self._values, text), key=len, reverse=True))

    def add_quoted(self, value: str | None) -> None:
        """Mask ``value``, a part of a URL (a password, a token), both as the URL writes it
        and percent-decoded: a client's error may quote either."""
        if value is not None:
            self.add(value)
            self.add(unquote(value))

    def add_header(self, value: str | bytes | None) -> None:
        """Mask a header's value whole and by its parts: each word of it of at least
        :data:`PART_MIN_CHARS` characters (the token of ``Bearer <token>``), the value of each
        ``name=value`` in it (a cookie, a Digest parameter), and for ``Basic <base64>``,
        ``user:password`` and the password."""
        text = value.decode(errors="replace") if isinstance(value, bytes) else value
        if not text:
            return
        self.add(text)
        words = [word for word in _PART_SEPARATORS.split(text.strip()) if word]
        for word in words:
            self._add_part(word)
            name, equals, _ = word.rstrip("=").partition("=")
            if equals and name:  # name=value; not base64's padding
                self._add_part(word.partition("=")[2].strip('"'))
        if len(words) == 2 and words[0].lower() == "basic":
            self._add_basic(words[1])

    def add_url(self, url: str) -> None:
        """Mask what a URL may carry of secrets: its password and the value of each query
        parameter (``?api_key=...``), as written and percent-decoded."""
        parts = urlsplit(url)
        self.add_quoted(parts.password)
        for _, value in parse_qsl(parts.query):
            self.add(value)
        for pair in parts.query.split("&"):
            self.add_quoted(pair.partition("=")[2] or None)

    def redact(self, text: str) -> str:
        """``text`` with every secret replaced by ``***``, the longest first."""
        for value in self._values:
            if value in text:
                text = text.replace(value, MASK)
        return text

    def shows(self, text: str) -> bool:
        """Whether ``text`` shows a secret."""
        return any(value in text for value in self._values)

    @contextlib.contextmanager
    def masking(self) -> Iterator[None]:
        """Re-raise what the block raises with every secret masked (see :func:`masked`)."""
        try:
            yield
        except Exception as error:
            safe = masked(error, self)
            if safe is error:
                raise
            raise safe from None

    def _add_part(self, part: str) -> None:
        if len(part) >= PART_MIN_CHARS:
            self.add(part)

    def _add_basic(self, encoded: str) -> None:
        try:
            decoded = base64.b64decode(encoded, validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            return
        self.add(encoded)
        _, colon, password = decoded.partition(":")
        if colon:
            # Known to be the credentials: masked from SECRET_MIN_CHARS, not PART_MIN_CHARS.
            self.add(decoded)
            self.add(password)


def describe_error(error: BaseException, secrets: Secrets) -> str:
    """``Type: message`` of a client's error, secrets masked, on one line."""
    message = " ".join(str(error).split())
    text = f"{type(error).__name__}: {message}" if message else type(error).__name__
    return secrets.redact(text)


def masked(error: Exception, secrets: Secrets) -> Exception:
    """``error`` itself when no secret shows in it or in what caused it; else an error of the
    same type whose message is masked, with no cause (the client's error, which quoted the
    secret, is left out; its type and masked message stay in the message when the type
    cannot be made again)."""
    if not secrets.shows("".join(traceback.format_exception(error))):
        return error
    message = secrets.redact(str(error))
    copy: Exception
    if isinstance(error, RetryAfter):
        reason = None if error.reason is None else secrets.redact(error.reason)
        copy = RetryAfter(error.seconds, reason=reason)
    else:
        try:
            copy = type(error)(message)
        except Exception:
            copy = DownstreamError(describe_error(error, secrets))
        if secrets.shows(str(copy)):  # a type that words its message itself
            copy = DownstreamError(describe_error(error, secrets))
    return copy
