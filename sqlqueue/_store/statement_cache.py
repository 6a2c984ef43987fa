"""Statements built once and reused: building a statement and its cache key costs more than a
small claim or completion itself, so the claim and the outcomes keep theirs here."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, TypeVar, cast

__all__ = ["cached_statement"]

T = TypeVar("T")

#: Statements built once per backend (and queue set) instead of on every call: building a
#: statement and its cache key costs more than a small claim or completion itself.
_STATEMENTS: dict[Hashable, Any] = {}


_MAX_STATEMENTS = 256


def cached_statement(key: Hashable, build: Callable[[], T]) -> T:
    """The statement cached under ``key``, built by ``build`` the first time (the cache is
    emptied when full: keys include queue sets, which a long-lived process may vary)."""
    stmt = _STATEMENTS.get(key)
    if stmt is None:
        if len(_STATEMENTS) >= _MAX_STATEMENTS:
            _STATEMENTS.clear()
        stmt = _STATEMENTS[key] = build()
    return cast(T, stmt)
