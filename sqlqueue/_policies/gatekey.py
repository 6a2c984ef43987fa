"""What rate limits and circuit breakers share: the key a job is gated under, and number checks.

A key is a fixed string or a function of the job's payload; without one, a gate covers its whole
task. Keys name rows in the database, so they are checked for type and length.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from sqlqueue._errors import ConfigurationError

__all__ = ["MAX_KEY_LENGTH", "GateKey", "check_key", "is_positive_number", "resolve_key"]

#: A gate's key: a fixed string, or a function of the job's payload that returns one.
GateKey = str | Callable[[Mapping[str, Any]], str]

#: The key columns are ``VARCHAR(255)``.
MAX_KEY_LENGTH = 255


def is_positive_number(value: object) -> bool:
    """Whether ``value`` is a finite int or float above zero (``True`` is not a number here)."""
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )


def check_key(field: str, key: object) -> None:
    """Refuse a configured key that is neither ``None``, a usable string, nor a function."""
    if key is None or callable(key):
        return
    if not isinstance(key, str) or not 1 <= len(key) <= MAX_KEY_LENGTH:
        raise ConfigurationError(
            f"{field} must be a string of 1..{MAX_KEY_LENGTH} characters or a function of the "
            f"payload, got {key!r}"
        )


def resolve_key(field: str, key: GateKey | None, payload: Mapping[str, Any], default: str) -> str:
    """The key of one job: the fixed key, the key function's answer, or ``default``."""
    if key is None:
        return default
    value = key if isinstance(key, str) else key(payload)
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_KEY_LENGTH:
        raise TypeError(
            f"{field} returned {value!r}; it must return a string of 1..{MAX_KEY_LENGTH} characters"
        )
    return value
