"""An SMTP server on loopback (aiosmtpd) that keeps what it is sent."""

from __future__ import annotations

import email
import email.policy
import threading
from email.message import EmailMessage

from aiosmtpd.smtp import SMTP, Envelope, Session


class Mailbox:
    """The aiosmtpd handler: every message received, with its envelope recipients."""

    def __init__(self) -> None:
        self.port = 0  # set once the server listens
        self._lock = threading.Lock()
        self._messages: list[tuple[EmailMessage, list[str]]] = []

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        raw = envelope.original_content or b""
        message = email.message_from_bytes(raw, policy=email.policy.default)
        assert isinstance(message, EmailMessage)
        with self._lock:
            self._messages.append((message, list(envelope.rcpt_tos)))
        return "250 Message accepted for delivery"

    @property
    def messages(self) -> list[EmailMessage]:
        with self._lock:
            return [m for m, _ in self._messages]

    @property
    def recipients(self) -> list[list[str]]:
        with self._lock:
            return [r for _, r in self._messages]
