"""Building the message: checked addresses, the Message-ID minted at enqueue, the content hash,
and the ``EmailMessage`` an attempt sends (standard library only).

An address is parsed once (:func:`parse_address`), refused if it is not one plain mailbox, and
from then on only its parsed parts are written: to the job as :func:`~._fold.address_text`, to
the message by :func:`~._fold.fold_addresses`. What the app typed is never sent as typed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from email import policy
from email.errors import NonASCIILocalPartDefect
from email.headerregistry import Address
from email.message import EmailMessage
from email.utils import format_datetime, make_msgid
from types import MappingProxyType

from sqlqueue.email._config import Content
from sqlqueue.email._errors import InvalidAddress, UnsafeHeader
from sqlqueue.email._fold import address_text, fold_addresses, fold_text
from sqlqueue.email._headers import decoded_layers, header_problem

__all__ = [
    "MAX_ADDR_SPEC_BYTES",
    "OutgoingMessage",
    "build_message",
    "check_address",
    "check_recipients",
    "content_hash",
    "envelope_address",
    "mint_message_id",
    "parse_address",
]

#: RFC 5321, 4.5.3.1.3: a path is at most 256 octets, its angle brackets included.
MAX_ADDR_SPEC_BYTES = 254


class OutgoingMessage(EmailMessage):
    """An ``EmailMessage`` that keeps the parsed addresses its address headers were written
    from, so that they can be written again (with ASCII domains, ``._wire``) without reading
    them back from the text."""

    addresses: Mapping[str, tuple[Address, ...]] = MappingProxyType({})


def parse_address(value: object, field: str) -> Address:
    """The one mailbox ``value`` names (``ada@example.com`` or ``Ada <ada@example.com>``), or
    :class:`InvalidAddress` naming ``field``.

    Refused: anything but exactly one mailbox (a list, a group ``name: …;``); a line break or
    control character, as given or once decoded; an encoded word that decodes to address
    syntax (``@``: it can only be there to show the reader another address) or to another
    encoded word; an addr-spec longer than 254 bytes (no server takes it)."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidAddress(f"{field}: expected an email address, got {value!r}")
    problem = header_problem(value)
    if problem is not None:
        raise InvalidAddress(f"{field}: {value!r} {problem}")
    try:
        header = policy.default.header_factory("To", value)
        groups = header.groups
        addresses = header.addresses
        defects = header.defects
    except Exception:  # the parser fails on some malformed input (e.g. "a@")
        raise InvalidAddress(f"{field}: {value!r} is not a valid email address") from None
    if any(group.display_name is not None for group in groups):
        raise InvalidAddress(f"{field}: {value!r} is a group (name: addresses;), not one address")
    if len(addresses) != 1:
        raise InvalidAddress(f"{field}: {value!r} must be one address, not {len(addresses)}")
    address: Address = addresses[0]
    # A non-ASCII local part (RFC 6531) is an address; only a server without SMTPUTF8 refuses it.
    defects = [defect for defect in defects if not isinstance(defect, NonASCIILocalPartDefect)]
    if defects or not address.username or not address.domain:
        raise InvalidAddress(f"{field}: {value!r} is not a valid email address")
    for part in (address.display_name, address.username, address.domain):
        problem = header_problem(part)  # decoded by the parser: checked as it will be written
        if problem is not None:
            raise InvalidAddress(f"{field}: {value!r} {problem}")
    name = address.display_name
    if "=?" in value and "@" in name:
        raise InvalidAddress(
            f"{field}: {value!r} has a display name whose encoded words decode to {name!r}: "
            "address syntax hidden in a display name is refused"
        )
    if len(decoded_layers(name)) > 1:  # it decodes again
        raise InvalidAddress(
            f"{field}: {value!r} has a display name that holds an encoded word once decoded "
            f"({name!r}): refused, a reader would decode it again"
        )
    size = len(address.addr_spec.encode("utf-8"))
    if size > MAX_ADDR_SPEC_BYTES:
        raise InvalidAddress(
            f"{field}: the address is {size} bytes long; SMTP allows {MAX_ADDR_SPEC_BYTES}"
        )
    return address


def check_address(value: object, field: str) -> str:
    """``value`` if it is exactly one valid address, as the text its parsed parts make
    (:func:`~._fold.address_text`), else :class:`InvalidAddress` naming ``field``."""
    return address_text(parse_address(value, field))


def envelope_address(value: str) -> str:
    """The bare ``user@domain`` of a checked address, for the SMTP envelope."""
    return str(parse_address(value, "address").addr_spec)


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
) -> OutgoingMessage:
    """The message: From, To, Subject, Date, the given Message-ID, and a text part (plus an
    HTML alternative when there is one). The addresses and the subject are parsed and written
    from what the parser made of them (``._fold``); :class:`UnsafeHeader` when an address
    stored in the job is not one that :func:`check_address` takes (a row written around
    ``Mailer.send``, or before these checks)."""
    try:
        senders = (parse_address(sender, "sender"),)
        recipients = tuple(parse_address(value, f"to[{i}]") for i, value in enumerate(to))
    except InvalidAddress as error:
        raise UnsafeHeader(f"the job's addresses cannot be sent: {error}") from None
    subject = str(policy.default.header_factory("Subject", content.subject))
    message = OutgoingMessage(policy=policy.SMTP)
    message.addresses = {"From": senders, "To": recipients}
    message.set_raw("From", fold_addresses("From", senders))
    message.set_raw("To", fold_addresses("To", recipients))
    message.set_raw("Subject", fold_text("Subject", subject))
    message["Date"] = format_datetime(date)
    message["Message-ID"] = message_id
    message.set_content(content.text)
    if content.html is not None:
        message.add_alternative(content.html, subtype="html")
    return message
