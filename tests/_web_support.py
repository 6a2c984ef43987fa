"""Moved to :mod:`tests._support.web`; this name stays importable for tests written against it."""

from __future__ import annotations

from tests._support.jobs import enqueue
from tests._support.web import KEY, TOKEN, make_queue, populated, serving, token_of

__all__ = ["KEY", "TOKEN", "enqueue", "make_queue", "populated", "serving", "token_of"]
