"""An in-process stand-in for an email provider's batch-send API: it records, never sends."""

from __future__ import annotations

import threading
from dataclasses import dataclass

# Providers cap batch sends (Postmark: 500 messages per call); the handler's batch_size matches.
MAX_MESSAGES_PER_CALL = 500


@dataclass(frozen=True, slots=True)
class Message:
    """One email."""

    to: str
    subject: str
    body: str


class MailerError(Exception):
    """The provider refused a whole call."""


class FakeMailer:
    """Records every batch it is given. Thread-safe: several workers may send at once."""

    def __init__(self, max_messages: int = MAX_MESSAGES_PER_CALL) -> None:
        self.max_messages = max_messages
        self._lock = threading.Lock()
        self._batches: list[list[Message]] = []
        self._keys: set[str] = set()

    def send_batch(self, messages: list[Message], *, idempotency_key: str) -> None:
        """Send ``messages`` in one call; a key already seen is a repeat and sends nothing."""
        if len(messages) > self.max_messages:
            raise MailerError(f"at most {self.max_messages} messages per call, got {len(messages)}")
        with self._lock:
            if idempotency_key in self._keys:
                return
            self._keys.add(idempotency_key)
            self._batches.append(list(messages))

    @property
    def batches(self) -> list[list[Message]]:
        """Every batch sent, in order."""
        with self._lock:
            return [list(batch) for batch in self._batches]

    @property
    def sent(self) -> list[Message]:
        """Every message sent, in order."""
        return [message for batch in self.batches for message in batch]

    def clear(self) -> None:
        """Forget everything sent (a fresh run of the example)."""
        with self._lock:
            self._batches.clear()
            self._keys.clear()
