"""Text derived from a job, made storable and short: redact first, then cut.

Every text sqlqueue keeps that came out of a job (an attempt's error and traceback, the details
a handler gave its ``Retry`` or ``PermanentError``, a payload quoted in an error) is shortened
by :func:`clip` and nowhere else. It replaces the job's secrets before it cuts, so a secret
that straddles the cut is never kept in part; and what the cut leaves at its edge is treated
as a secret when it could be one: a prefix of a secret at the end of a text cut short (or a
suffix at the start of a text whose head was cut off) becomes ``"***"`` too. The worker's log,
the spans, the CLI and the web page show the texts as stored, so they inherit this.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal
from urllib.parse import quote, quote_plus

if TYPE_CHECKING:
    from sqlqueue._secrets import Redactor

__all__ = [
    "REDACTED",
    "clip",
    "hide_passwords",
    "password_of",
    "shorten",
    "storable",
    "url_encoded",
]

#: What a secret looks like everywhere but in its handler's arguments.
REDACTED = "***"


def storable(text: str) -> str:
    """``text`` as every backend can store it: NUL (PostgreSQL refuses it in text and JSON) and
    lone surrogates (not UTF-8: a path decoded with ``surrogateescape``) become escapes. An
    error message that cannot be written would otherwise fail its outcome's write for ever."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def url_encoded(text: str) -> set[str]:
    """``text`` as the usual ways of putting it in a URL write it: ``urllib.parse.quote``
    (``safe="/"``, its default, and ``safe=""``) and ``quote_plus`` (``urlencode``: the query
    strings that requests and httpx's ``params=`` build), UTF-8, upper-case hex. A secret that
    an HTTP library puts in a URL reaches an error message in one of these forms; another
    encoding (lower-case hex, other characters left as they are, encoded twice) is not here."""
    forms = set()
    for safe in ("", "/"):
        forms.add(quote(text, safe=safe, encoding="utf-8", errors="surrogatepass"))
        forms.add(quote_plus(text, safe=safe, encoding="utf-8", errors="surrogatepass"))
    return forms


def clip(
    text: str,
    limit: int,
    *,
    redactor: Redactor | None = None,
    keep: Literal["head", "tail"] = "head",
) -> str:
    """``text`` with ``redactor``'s secrets replaced by :data:`REDACTED`, made
    :func:`storable`, and cut to at most ``limit`` characters, keeping its ``head`` (an error
    message) or its ``tail`` (a traceback: the last frames say the most). The redaction comes
    first; then a partial secret left at the cut is replaced as well."""
    needles: Sequence[str] = ()
    if redactor is not None and redactor.needles:
        text = redactor.text(text)
        needles = redactor.needles
    text = storable(text)
    if len(text) <= limit:
        return text
    if keep == "head":
        return _cut_head(text, limit, needles)
    return _cut_head(text[::-1], limit, [needle[::-1] for needle in needles])[::-1]


def _cut_head(text: str, limit: int, needles: Sequence[str]) -> str:
    """The first ``limit`` characters of ``text``, a partial secret at their end replaced
    (the tail cut is this one on the reversed text, with reversed secrets)."""
    cut = text[:limit]
    overhang = _overhang(cut, needles)
    if not overhang:
        return cut
    # Room for the marker: the shorter cut may end in (another) partial secret in turn.
    cut = cut[: min(len(cut) - overhang, max(0, limit - len(REDACTED)))]
    cut = cut[: len(cut) - _overhang(cut, needles)]
    return cut + REDACTED if limit >= len(REDACTED) else cut


def _overhang(text: str, needles: Sequence[str]) -> int:
    """How many characters at the end of ``text`` are the start of a secret (the longest such
    run over all secrets; 0 when none is). A whole secret there was already redacted."""
    longest = 0
    for needle in needles:
        first = needle[0]
        start = max(0, len(text) - len(needle) + 1)
        position = text.find(first, start)
        while position != -1:
            run = len(text) - position
            if run <= longest:
                break
            if needle.startswith(text[position:]):
                longest = run
                break
            position = text.find(first, position + 1)
    return longest


def shorten(text: str, width: int) -> str:
    """A stored text cut to ``width`` characters for display (the CLI's tables, the web page's
    lists), ``"…"`` marking the cut. What is stored was redacted by :func:`clip` before it was
    written, so only the display's own cut is made here, by the same function."""
    if len(text) <= width:
        return text
    return clip(text, max(0, width - 1)) + "…"


#: A URL's ``scheme://user:password@``: the password runs to the *last* ``@`` of the URL's
#: word (an unencoded ``@`` in it must not end it early and leave its rest in the clear).
_USERINFO = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^:/?#@\s'\"]*):[^\s'\"]*@")


def hide_passwords(text: str) -> str:
    """``text`` with the password of every URL in it shown as ``***``: errors, logs and the
    command line's messages must not print one, whatever characters it holds."""
    return _USERINFO.sub(rf"\g<head>:{REDACTED}@", text)


def password_of(url: str) -> str | None:
    """The password of ``url`` as written (up to its last ``@``), or ``None`` without one."""
    found = _USERINFO.search(url)
    if found is None:
        return None
    return found.group(0)[len(found.group("head")) + 1 : -1]
