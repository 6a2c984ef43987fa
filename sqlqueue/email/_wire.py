"""One message onto one open connection: the envelope and headers in the forms the server takes,
and the bytes :func:`~sqlqueue.email._headers.flatten` checked, sent as they are.

A server with SMTPUTF8 gets every address as it was given. Without it, an internationalised
domain goes in its IDNA (punycode) form, in the envelope and in the ``From``/``To`` headers
(``ada@bücher.example`` becomes ``ada@xn--bcher-kva.example``): the message is delivered instead
of failing every attempt until dead. A non-ASCII local part has no ASCII form, so only then is
the message refused, at once and saying why (:class:`SMTPPermanentError`).
"""

from __future__ import annotations

from collections.abc import Sequence
from email.headerregistry import Address

import aiosmtplib
from aiosmtplib import SMTPResponse

from sqlqueue.email._errors import SMTPPermanentError
from sqlqueue.email._fold import fold_addresses
from sqlqueue.email._headers import flatten
from sqlqueue.email._message import OutgoingMessage

__all__ = ["ascii_address", "send"]


async def send(
    client: aiosmtplib.SMTP, message: OutgoingMessage, sender: str, recipients: Sequence[str]
) -> tuple[dict[str, SMTPResponse], str]:
    """Send ``message`` from ``sender`` to ``recipients`` (bare addresses) over ``client``:
    aiosmtplib's ``send_message``, but with sqlqueue's checked bytes and the IDNA fallback.
    The refusals come back keyed by the addresses as given."""
    if client.is_ehlo_or_helo_needed:
        await client.ehlo()
    smtputf8 = client.supports_extension("smtputf8")
    wire = {address: address for address in recipients}
    if not smtputf8 and not _is_ascii(sender, *recipients):
        sender = ascii_address(sender)
        wire = {address: ascii_address(address) for address in recipients}
        message = _with_ascii_headers(message)
    utf8 = not _is_ascii(sender, *wire.values())
    eight_bit = client.supports_extension("8bitmime")
    options = (["SMTPUTF8"] if utf8 else []) + (["BODY=8BITMIME"] if eight_bit else [])
    flat = flatten(message, utf8=utf8, eight_bit=eight_bit)
    refused, reply = await client.sendmail(sender, list(wire.values()), flat, mail_options=options)
    given = {sent: address for address, sent in wire.items()}
    return {given.get(sent, sent): answer for sent, answer in refused.items()}, reply


def _is_ascii(*texts: str) -> bool:
    return all(text.isascii() for text in texts)


def ascii_address(address: str) -> str:
    """``user@domain`` with its domain in IDNA form, or :class:`SMTPPermanentError` when the
    local part is not ASCII (no form of it reaches a server without SMTPUTF8)."""
    local, _, domain = address.rpartition("@")
    if not local.isascii():
        raise SMTPPermanentError(
            f"{address!r} has a non-ASCII local part ({local!r}), and the server does not "
            "offer SMTPUTF8: it cannot be sent there; use a server with SMTPUTF8 or an ASCII "
            "address"
        )
    try:
        ascii_domain = domain.encode("idna").decode("ascii")
    except UnicodeError as error:
        raise SMTPPermanentError(
            f"{address!r}: the domain {domain!r} has no IDNA form ({error}), and the server "
            "does not offer SMTPUTF8"
        ) from None
    return f"{local}@{ascii_domain}"


def _with_ascii_headers(message: OutgoingMessage) -> OutgoingMessage:
    """A copy of ``message`` whose address headers hold ASCII addresses, written again from
    the parsed addresses it keeps (display names stay as they were written); every other
    header and the body as they are."""
    copy = OutgoingMessage(policy=message.policy)
    copy.addresses = {
        name: tuple(
            Address(display_name=address.display_name, addr_spec=ascii_address(address.addr_spec))
            for address in addresses
        )
        for name, addresses in message.addresses.items()
    }
    for name, value in message.raw_items():
        if name in copy.addresses:
            copy.set_raw(name, fold_addresses(name, copy.addresses[name]))
        else:
            copy.set_raw(name, value)
    copy.set_payload(message.get_payload())
    return copy
