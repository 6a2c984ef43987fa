"""Building the message: checked addresses, the Message-ID minted at enqueue, the content hash,
and the ``EmailMessage`` an attempt sends (standard library only)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from datetime import datetime
from email import policy
from email.errors import NonASCIILocalPartDefect
from email.message import EmailMessage
from email.utils import format_datetime, make_msgid

from sqlqueue.email._config import Content
from sqlqueue.email._errors import InvalidAddress
from sqlqueue.email._headers import header_problem

__all__ = [
    "build_message",
    "check_address",
    "check_recipients",
    "content_hash",
    "envelope_address",
    "mint_message_id",
]


def check_address(value: object, field: str) -> str:
    """``value`` if it is exactly one valid address (``ada@example.com`` or ``Ada
    <ada@example.com>``), else :class:`InvalidAddress` naming ``field``."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidAddress(f"{field}: expected an email address, got {value!r}")
    problem = header_problem(value)
    if problem is not None:
        raise InvalidAddress(f"{field}: {value!r} {problem}")
    probe = EmailMessage()
    try:
        probe["To"] = value
        header = probe["To"]
        addresses = header.addresses
        defects = header.defects
    except Exception:  # the parser fails on some malformed input (e.g. "a@")
        raise InvalidAddress(f"{field}: {value!r} is not a valid email address") from None
    if len(addresses) != 1:
        raise InvalidAddress(f"{field}: {value!r} must be one address, not {len(addresses)}")
    address = addresses[0]
    # A non-ASCII local part (RFC 6531) is an address; only a server without SMTPUTF8 refuses it.
    defects = [defect for defect in defects if not isinstance(defect, NonASCIILocalPartDefect)]
    if defects or not address.username or not address.domain:
        raise InvalidAddress(f"{field}: {value!r} is not a valid email address")
    for part in (address.display_name, address.username, address.domain):
        problem = header_problem(part)  # decoded by the parser: checked as it will be written
        if problem is not None:
            raise InvalidAddress(f"{field}: {value!r} {problem}")
    return value.strip()


def envelope_address(value: str) -> str:
    """The bare ``user@domain`` of a checked address, for the SMTP envelope."""
    probe = EmailMessage()
    probe["To"] = value
    return str(probe["To"].addresses[0].addr_spec)


def check_recipients(to: str | Sequence[str]) -> list[str]:
    """One address or a non-empty list of them, each checked; duplicates dropped in order."""
    values = [to] if isinstance(to, str) else list(to) if isinstance(to, Sequence) else None
    if not values:
        raise InvalidAddress(f"to: expected an address or a non-empty list of them, got {to!r}")
    checked = [check_address(value, f"to[{index}]") for index, value in enumerate(values)]
    return list(dict.fromkeys(checked))


def mint_message_id(sender: str) -> str:
    """A new, globally unique ``<…@domain>`` under the sender's domain."""
    domain = envelope_address(sender).rpartition("@")[2]
    return make_msgid(domain=domain)


def content_hash(content: Content) -> str:
    """``sha256:…`` of the subject and bodies: names content sent without a template."""
    canonical = json.dumps([content.subject, content.text, content.html], ensure_ascii=False)
    return "sha256:" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def build_message(
    *, sender: str, to: Sequence[str], message_id: str, content: Content, date: datetime
) -> EmailMessage:
    """The message: From, To, Subject, Date, the given Message-ID, and a text part (plus an
    HTML alternative when there is one)."""
    message = EmailMessage(policy=policy.SMTP)
    message["From"] = sender
    message["To"] = ", ".join(to)
    message["Subject"] = content.subject
    message["Date"] = format_datetime(date)
    message["Message-ID"] = message_id
    message.set_content(content.text)
    if content.html is not None:
        message.add_alternative(content.html, subtype="html")
    return message
