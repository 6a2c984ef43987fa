"""Header values written from parsed values: a message's addresses and subject laid out so that
a receiver parses exactly what sqlqueue checked.

Python's email package folds a header from the text it was given, and loses what kept that
text one address: an RFC 2047 encoded word in a display name is decoded and, being plain ASCII,
written out bare, so ``=?utf-8?q?eve=40evil.example=2C?= <ada@example.com>`` went out as
``eve@evil.example, <ada@example.com>`` (two addresses to the reader, and Reply-All mails eve);
and a word longer than a line is never cut (a 2,000-character display name made a 2,001-byte
line, where RFC 5322 allows 998, and the server refused the message). So sqlqueue writes these
values itself, from the parsed address (display name, addr-spec) and the decoded subject:

* a display name of plain ASCII words (atoms) is written as it is; other printable ASCII as one
  quoted string (``"Lovelace, Ada"``, ``\\`` and ``"`` escaped); anything else (non-ASCII, a
  word too long for a line) as RFC 2047 encoded words of at most 75 characters each;
* a subject of plain ASCII words as it is; anything else as encoded words;
* lines are folded at spaces to 78 characters; only an addr-spec is never cut (at most 254
  bytes, checked at enqueue), so no line comes near 998 bytes.

The result is ASCII, but for a non-ASCII addr-spec (sent only to a server with SMTPUTF8: see
``._wire``). Text holding ``=?`` is always encoded, so a receiver never decodes a second layer.
:func:`address_text` is an address's stored form (in the job's payload): the same choice
without encoded words or folding, which the parser reads back as the same address.
"""

from __future__ import annotations

import base64
import string
from collections.abc import Sequence
from email.headerregistry import Address

__all__ = ["address_text", "fold_addresses", "fold_text"]

#: RFC 5322's atext: a word of these needs no quotes.
_ATEXT = frozenset(string.ascii_letters + string.digits + "!#$%&'*+-/=?^_`{|}~")
#: What an encoded word in a phrase may carry as it is (RFC 2047, 5 (3)); the rest is ``=XX``.
_Q_PLAIN = frozenset(string.ascii_letters + string.digits + "!*+-/")
_PRINTABLE = frozenset(chr(code) for code in range(0x20, 0x7F))
#: Where lines are folded (RFC 5322's "SHOULD"), and the longest word written as it is.
_LINE = 78
_LONGEST_WORD = 70
#: RFC 2047's limit for one encoded word.
_ENCODED_WORD = 75


def fold_addresses(name: str, addresses: Sequence[Address]) -> str:
    """The value of address header ``name`` (``From``, ``To``) for ``addresses``, folded."""
    tokens: list[str] = []
    for index, address in enumerate(addresses):
        if address.display_name:
            words = [*_display_words(address.display_name), f"<{address.addr_spec}>"]
        else:
            words = [address.addr_spec]
        if index < len(addresses) - 1:
            words[-1] += ","
        tokens += words
    return _fold(name, tokens)


def fold_text(name: str, text: str) -> str:
    """The value of unstructured header ``name`` (``Subject``) holding ``text``, folded."""
    words = text.split(" ")
    if all(word and set(word) <= _PRINTABLE and _plain(word) for word in words):
        return _fold(name, words)
    return _fold(name, _encoded_words(text))


def address_text(address: Address) -> str:
    """``address`` as text the parser reads back as the same display name and addr-spec:
    ``Ada Lovelace <ada@example.com>``, ``"Lovelace, Ada" <ada@example.com>`` or
    ``ada@example.com``. Its display name must hold no control character and no encoded word
    (``_message.parse_address`` refuses both)."""
    name = address.display_name
    if not name:
        return address.addr_spec
    words = name.split(" ")
    if "=?" in name or not all(word and all(map(_is_atext, word)) for word in words):
        name = _quoted(name)
    return f"{name} <{address.addr_spec}>"


def _display_words(name: str) -> list[str]:
    """A display name as the words of the header value, in the first form that fits: atoms,
    one quoted string (its spaces may fold), or encoded words."""
    words = name.split(" ")
    if all(word and set(word) <= _ATEXT and _plain(word) for word in words):
        return words
    if set(name) <= _PRINTABLE and all(_plain(word) for word in words):
        return _quoted(name).split(" ")
    return _encoded_words(name)


def _plain(word: str) -> bool:
    """A word that can go as it is: no ``=?`` a receiver would decode, short enough to fold."""
    return "=?" not in word and len(word) <= _LONGEST_WORD


def _is_atext(char: str) -> bool:
    """An atom's character (RFC 6532 adds every non-ASCII character but spaces)."""
    return char in _ATEXT or (not char.isascii() and char.isprintable() and not char.isspace())


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _encoded_words(text: str) -> list[str]:
    """``text`` as UTF-8 encoded words of at most 75 characters, each holding whole characters
    (Q or B, whichever is shorter). A reader joins adjacent encoded words without the space
    between them (RFC 2047, 6.2)."""
    words: list[str] = []
    chunk = ""
    for char in text:
        if chunk and len(_encoded_word(chunk + char)) > _ENCODED_WORD:
            words.append(_encoded_word(chunk))
            chunk = ""
        chunk += char
    words.append(_encoded_word(chunk))
    return words


def _encoded_word(text: str) -> str:
    data = text.encode("utf-8")
    q = "".join(
        "_" if byte == 0x20 else chr(byte) if chr(byte) in _Q_PLAIN else f"={byte:02X}"
        for byte in data
    )
    b = base64.b64encode(data).decode("ascii")
    return f"=?utf-8?q?{q}?=" if len(q) <= len(b) else f"=?utf-8?b?{b}?="


def _fold(name: str, tokens: Sequence[str]) -> str:
    """``tokens`` joined by spaces, a line break put before a token where the line (``name:``
    included) would pass 78 characters. Unfolding (removing the CR LF) gives the joined text
    back, and no line is only spaces (no break goes before an empty token)."""
    lines: list[str] = []
    line = tokens[0]
    used = len(name) + 2 + len(line)
    for token in tokens[1:]:
        if token and used + 1 + len(token) > _LINE:
            lines.append(line)
            line = " " + token
            used = len(line)
        else:
            line += " " + token
            used += 1 + len(token)
    lines.append(line)
    return "\r\n".join(lines)
