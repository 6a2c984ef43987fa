"""Reading a whole number from outside (a URL, a form, the command line, an HTTP header).

``str.isdigit()`` says yes to ``"²"`` and other Unicode digits, which ``int()`` then refuses
(an HTTP 500, a traceback) or reads as a number nobody typed (``"٣"`` is 3). Every number that
comes from outside goes through :func:`ascii_number`: ASCII digits only, of a bounded length,
and each caller says in its own terms (a 400 naming the parameter, exit 2, the default
backoff) that it was not one.
"""

from __future__ import annotations

__all__ = ["MAX_DIGITS", "ascii_number"]

#: The most digits read: any id or count sqlqueue stores (a BIGINT has 19).
MAX_DIGITS = 19

_DIGITS = frozenset("0123456789")


def ascii_number(text: str, *, max_digits: int = MAX_DIGITS) -> int | None:
    """``text`` as a whole number >= 0 when it is 1 to ``max_digits`` ASCII digits (no sign,
    no spaces, no other digits); ``None`` otherwise."""
    if not 0 < len(text) <= max_digits or not _DIGITS.issuperset(text):
        return None
    return int(text)
