"""Header values that stay the headers the app wrote: checked after decoding, generated under a
policy that refuses injected headers, and checked again as bytes before they are sent.

An RFC 2047 encoded word (``=?utf-8?q?hi=0D=0ABcc:_x@evil?=``) holds a CR LF that only shows
once it is decoded, and Python's email package decodes it when the header is set and writes the
break out raw when the message is generated: the server reads an extra ``Bcc:`` (or, after a
blank line, body text). Whether the interpreter stops that (``verify_generated_headers``) depends
on its patch level, so sqlqueue does not rely on it:

* :func:`header_problem` looks at a value as given and as decoded (repeatedly: an encoded word
  may hold another) for any line break, ``str.splitlines``'s set (``\\v``, ``\\f``, ``\\x85``,
  ``\\u2028`` …), and any other control character (C0, tab included, DEL and C1); the subject
  and the addresses are checked with it at enqueue, and a template's rendered subject before an
  attempt sends;
* :func:`flatten` generates the message under ``policy.SMTP`` (with ``verify_generated_headers``
  where the interpreter has it), then reads the header block it produced back and refuses it
  unless it holds exactly the headers the message was given, in order: the bytes checked are
  the bytes sent. No line of the message may be longer than RFC 5322's 998 bytes, and no
  control character may be in its header block.

The values themselves are written by :mod:`._fold`, from what the parser made of them.
"""

from __future__ import annotations

import contextlib
import io
from email import policy
from email.generator import BytesGenerator
from email.header import decode_header, make_header
from email.message import EmailMessage

from sqlqueue.email._errors import UnsafeHeader

__all__ = [
    "CONTROLS",
    "LINE_BREAKS",
    "MAX_LINE_BYTES",
    "decoded_layers",
    "flatten",
    "header_problem",
]

#: Every character ``str.splitlines`` breaks at, and NUL: none belongs in a header value.
LINE_BREAKS = "\r\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029\x00"
#: The C0 controls (tab included), DEL and the C1 controls: a reader's terminal or mail client
#: may act on them, and none is text.
CONTROLS = frozenset(chr(code) for code in (*range(0x20), *range(0x7F, 0xA0)))
_FORBIDDEN = CONTROLS | frozenset(LINE_BREAKS)
#: RFC 5322, 2.1.1: a line is at most 998 bytes, its CR LF not counted.
MAX_LINE_BYTES = 998
#: How many layers of encoded words are taken off before a value is judged.
_MAX_LAYERS = 4
#: Python 3.13 (and some patch releases before it) can refuse injected headers itself.
_VERIFIES = hasattr(policy.SMTP, "verify_generated_headers")


def header_problem(value: str) -> str | None:
    """Why ``value`` cannot be a header's value (``None`` when it can): a line break or another
    control character in it as given or once its RFC 2047 encoded words are decoded, or a lone
    surrogate (an encoded word whose bytes are not text in its charset decodes to those)."""
    for shown in decoded_layers(value):
        how = "" if shown is value else " once its encoded words are decoded"
        for char in shown:
            if char in _FORBIDDEN:
                return f"contains a line break or control character ({char!r}){how}"
            if "\ud800" <= char <= "\udfff":  # bytes that were not text in their charset
                return f"contains something that is not text ({char!r}){how}"
    return None


def decoded_layers(value: str) -> list[str]:
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
    # refold_source="none": the values sqlqueue wrote itself (``set_raw``, see ``._fold``) go
    # out as written; the policy's folder would undo their quoting (see ``._fold``).
    chosen = base.clone(cte_type="8bit" if eight_bit else "7bit", refold_source="none")
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
    line ends, no other control character and exactly the headers ``expected``, in that order,
    and no line of it is longer than :data:`MAX_LINE_BYTES`."""
    end = flat.find(b"\r\n\r\n")
    block = flat if end == -1 else flat[:end]
    unbroken = block.replace(b"\r\n", b"")
    if b"\r" in unbroken or b"\n" in unbroken:
        raise UnsafeHeader("a header value holds a bare CR or LF: the message was not sent")
    controls = sorted(set(unbroken.decode("utf-8", "replace")) & CONTROLS)
    if controls:
        raise UnsafeHeader(
            f"a header value holds control characters {controls}: the message was not sent"
        )
    longest = max(len(line) for line in flat.split(b"\r\n"))
    if longest > MAX_LINE_BYTES:
        raise UnsafeHeader(
            f"a line of the message is {longest} bytes long (RFC 5322 allows "
            f"{MAX_LINE_BYTES}): the message was not sent"
        )
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
