"""Header values that stay the headers the app wrote: checked after decoding, generated under a
policy that refuses injected headers, and checked again as bytes before they are sent.

An RFC 2047 encoded word (``=?utf-8?q?hi=0D=0ABcc:_x@evil?=``) holds a CR LF that only shows
once it is decoded, and Python's email package decodes it when the header is set and writes the
break out raw when the message is generated: the server reads an extra ``Bcc:`` (or, after a
blank line, body text). Whether the interpreter stops that (``verify_generated_headers``) depends
on its patch level, so sqlqueue does not rely on it:

* :func:`header_problem` looks at a value as given and as decoded (repeatedly: an encoded word
  may hold another) for any line break, ``str.splitlines``'s set (``\\v``, ``\\f``, ``\\x85``,
  ``\\u2028`` …) and NUL; the subject and the addresses are checked with it at enqueue, and a
  template's rendered subject before an attempt sends;
* :func:`flatten` generates the message under ``policy.SMTP`` (with ``verify_generated_headers``
  where the interpreter has it), then reads the header block it produced back and refuses it
  unless it holds exactly the headers the message was given, in order: the bytes checked are
  the bytes sent.
"""

from __future__ import annotations

import contextlib
import io
from email import policy
from email.generator import BytesGenerator
from email.header import decode_header, make_header
from email.message import EmailMessage

from sqlqueue.email._errors import UnsafeHeader

__all__ = ["LINE_BREAKS", "flatten", "header_problem"]

#: Every character ``str.splitlines`` breaks at, and NUL: none belongs in a header value.
LINE_BREAKS = "\r\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029\x00"
#: How many layers of encoded words are taken off before a value is judged.
_MAX_LAYERS = 4
#: Python 3.13 (and some patch releases before it) can refuse injected headers itself.
_VERIFIES = hasattr(policy.SMTP, "verify_generated_headers")


def header_problem(value: str) -> str | None:
    """Why ``value`` cannot be a header's value (``None`` when it can): a line break or NUL in
    it as given or once its RFC 2047 encoded words are decoded."""
    for shown in _decodings(value):
        for char in shown:
            if char in LINE_BREAKS:
                how = "" if shown is value else " once its encoded words are decoded"
                return f"contains a line break or NUL ({char!r}){how}"
    return None


def _decodings(value: str) -> list[str]:
    """``value`` and what it decodes to, as ``email.header`` and as the header parser each
    decode it, layer after layer; a value that does not decode is judged as it is."""
    found = [value]
    current = value
    for _ in range(_MAX_LAYERS):
        decoded = []
        # A malformed word or an unknown charset: the parser keeps it literal.
        with contextlib.suppress(Exception):
            decoded.append(str(make_header(decode_header(current))))
        with contextlib.suppress(Exception):
            decoded.append(str(policy.default.header_factory("Subject", current)))
        fresh = [text for text in decoded if text not in found]
        if not fresh:
            break
        found += fresh
        current = fresh[0]
    return found


def flatten(message: EmailMessage, *, utf8: bool, eight_bit: bool) -> bytes:
    """``message`` as the bytes to send (CRLF line ends; UTF-8 headers only with ``utf8``, the
    server's SMTPUTF8), or :class:`UnsafeHeader` when its header block is not exactly the
    headers it was given."""
    base = policy.SMTPUTF8 if utf8 else policy.SMTP
    chosen = base.clone(cte_type="8bit" if eight_bit else "7bit")
    if _VERIFIES:
        chosen = chosen.clone(verify_generated_headers=True)  # type: ignore[call-arg,unused-ignore]
    buffer = io.BytesIO()
    try:
        BytesGenerator(buffer, policy=chosen).flatten(message)
    except UnsafeHeader:
        raise
    except Exception as error:  # HeaderWriteError where the interpreter checks itself
        raise UnsafeHeader(f"the message's headers cannot be written safely: {error}") from None
    flat = buffer.getvalue()
    _check_header_block(flat, [name.lower() for name in message])
    return flat


def _check_header_block(flat: bytes, expected: list[str]) -> None:
    """Refuse ``flat`` unless its header block (up to the first empty line) holds only CRLF
    line ends and exactly the headers ``expected``, in that order."""
    end = flat.find(b"\r\n\r\n")
    block = flat if end == -1 else flat[:end]
    if b"\r" in block.replace(b"\r\n", b"") or b"\n" in block.replace(b"\r\n", b""):
        raise UnsafeHeader("a header value holds a bare CR or LF: the message was not sent")
    names = [
        line.split(b":", 1)[0].strip().lower().decode("ascii", "replace")
        for line in block.split(b"\r\n")
        if line and line[:1] not in (b" ", b"\t")
    ]
    if names != expected:
        extra = [name for name in names if name not in expected] or names
        raise UnsafeHeader(
            f"the generated message's headers are {names}, not the {expected} it was given "
            f"(a header value injected {extra}): the message was not sent"
        )
