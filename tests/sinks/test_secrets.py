"""The masking of a sink's secrets, and the words of the errors a sink raises: one line, no
secret."""

from __future__ import annotations

import pytest

from outbox import DownstreamError
from outbox.sinks.errors import downstream_failed, not_a_message
from outbox.sinks.secrets import PART_MIN_CHARS, Secrets


def test_a_url_part_is_masked_as_written_and_decoded() -> None:
    """A password given percent-encoded in a URL is masked in both spellings."""
    secrets = Secrets()
    secrets.add_quoted("p%40ss-w0rd")

    assert "*** or ***" == secrets.redact("p%40ss-w0rd or p@ss-w0rd")


def test_a_failure_and_an_event_not_a_message_say_so_in_one_line_with_no_secret() -> None:
    """The errors a sink raises name the downstream, or the event, and mask its secrets."""
    secrets = Secrets(["s3cret"])
    error = ConnectionError("refused by\nhost with s3cret")

    failed = downstream_failed("Broker at host", error, secrets)
    refused = not_a_message(42, error, secrets)

    assert "Broker at host: ConnectionError: refused by host with ***" == str(failed)
    assert "event 42 cannot be made a message: ConnectionError: refused by host with ***" == str(
        refused
    )


def test_a_header_is_masked_whole_and_by_its_parts() -> None:
    """``Bearer <token>`` masks the token alone too; the scheme word stays readable."""
    secrets = Secrets()
    secrets.add_header("Bearer tok-0123456789")

    assert "***; token ***" == secrets.redact("Bearer tok-0123456789; token tok-0123456789")


def test_basic_auth_is_masked_as_base64_user_and_password_and_password() -> None:
    """``Basic <base64>`` masks the base64, ``user:password`` and the password alone."""
    secrets = Secrets()
    secrets.add_header("Basic YXBwOmh1bnRlcjI=")  # app:hunter2

    assert "*** *** *** app" == secrets.redact("YXBwOmh1bnRlcjI= app:hunter2 hunter2 app")


def test_a_part_shorter_than_the_minimum_is_not_masked_alone() -> None:
    """Parts under PART_MIN_CHARS (a short cookie value, the scheme) are masked only as
    part of the whole value."""
    secrets = Secrets()
    secrets.add_header("session=abc1234; theme=dark-mode-on")

    assert (8, "*** | abc1234 | *** | Bearer") == (
        PART_MIN_CHARS,
        secrets.redact("session=abc1234; theme=dark-mode-on | abc1234 | dark-mode-on | Bearer"),
    )


def test_a_url_masks_its_password_and_query_values_as_written_and_decoded() -> None:
    """A URL's password and each query value are masked, percent-encoded or not."""
    secrets = Secrets()
    secrets.add_url("https://app:p%40ss-w0rd@api.example/x?api_key=k%2Fy-123&page=2")

    assert "*** *** *** *** app 2" == secrets.redact(
        "p%40ss-w0rd p@ss-w0rd k%2Fy-123 k/y-123 app 2"
    )


def test_an_error_quoting_a_secret_is_raised_again_masked_without_its_cause() -> None:
    """What a block raises is re-raised with its secrets masked, the cause that quoted them
    left out; an error without a secret is raised as it is."""
    secrets = Secrets(["s3cret-token"])
    clean = ValueError("nothing to hide")

    def failing() -> None:
        try:
            raise ConnectionError("refused s3cret-token")
        except ConnectionError as error:
            raise DownstreamError(f"down: {error}") from error

    def raising_clean() -> None:
        raise clean

    with pytest.raises(DownstreamError) as raised, secrets.masking():
        failing()
    with pytest.raises(ValueError, match="nothing to hide") as kept, secrets.masking():
        raising_clean()

    assert ("down: refused ***", None, True) == (
        str(raised.value),
        raised.value.__cause__,
        kept.value is clean,
    )
