"""The check of a handler's progress report (``ctx.progress``), before it reaches the worker.

A report is written on the worker's database thread, batched with other jobs' reports: a value
the database refuses (NaN in JSON, NUL in text) would lose the whole batch, and raised in the
handler instead it names the call that made it.
"""

from __future__ import annotations

import math
from typing import Any

from sqlqueue._errors import ConfigurationError

__all__ = ["MAX_NOTE_CHARS", "check_progress"]

#: The longest progress note: a line for a person, not a log.
MAX_NOTE_CHARS = 1_000


def check_progress(done: object, total: object, note: object) -> dict[str, Any]:
    """``done``, ``total`` and ``note`` as the progress document holds them, or
    :class:`ConfigurationError` naming the first that a database cannot store as given."""
    checked: dict[str, Any] = {"done": _amount("done", done)}
    checked["total"] = None if total is None else _amount("total", total)
    if note is not None:
        if not isinstance(note, str):
            raise ConfigurationError(
                f"progress note must be a string, got {type(note).__name__} {note!r:.80}"
            )
        if len(note) > MAX_NOTE_CHARS:
            raise ConfigurationError(
                f"progress note is {len(note)} characters long, over {MAX_NOTE_CHARS}"
            )
        if "\x00" in note:
            raise ConfigurationError(
                "progress note contains a NUL character (\\x00): databases cannot store it"
            )
        try:
            note.encode("utf-8")
        except UnicodeEncodeError as bad:
            raise ConfigurationError(
                f"progress note is not valid Unicode: a lone surrogate at position {bad.start}"
            ) from None
    checked["note"] = note
    return checked


def _amount(field: str, value: object) -> float | int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigurationError(
            f"progress {field} must be a number, got {type(value).__name__} {value!r:.80}"
        )
    try:
        number = float(value)
    except OverflowError:  # an int past a float's range: no JSON reader takes it back
        number = math.inf
    if not math.isfinite(number) or number < 0:
        raise ConfigurationError(
            f"progress {field} must be a finite number >= 0, got {value!r:.80}"
        )
    return value
