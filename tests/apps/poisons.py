"""The poisons of the poison process test: one handler for each value a handler can hand back
that no database stores as given, by task name (registered by ``tests/apps/poison_app.py``)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from sqlqueue import Retry, Snooze
from tests._support.refusals import MARK

__all__ = ["POISONS"]


class Unprintable(Exception):
    """An error whose ``str()`` raises."""

    def __str__(self) -> str:
        raise RuntimeError("no text for you")


def _raise(error: BaseException) -> Callable[[], Any]:
    def handler() -> Any:
        raise error

    return handler


def _retry(delay: float) -> Callable[[], Any]:
    def handler() -> Any:
        raise Retry(delay=delay)

    return handler


def _snooze(delay: float) -> Callable[[], Any]:
    def handler() -> Any:
        raise Snooze(delay=delay)

    return handler


def _returns(value: Any) -> Callable[[], Any]:
    def handler() -> Any:
        return value

    return handler


#: Each poison's task name, and its handler.
POISONS: dict[str, Callable[[], Any]] = {
    "poison.retry_inf": _retry(math.inf),
    "poison.retry_nan": _retry(math.nan),
    "poison.retry_past_9999": _retry(1e20),
    "poison.snooze_past_9999": _snooze(1e15),
    "poison.nul_in_error": _raise(ValueError("a NUL \x00 in the message")),
    "poison.unprintable_error": _raise(Unprintable()),
    "poison.nul_in_result": _returns({"text": "a NUL \x00 in the result"}),
    "poison.huge_result": _returns("x" * 40_000_000),
    "poison.refused_failure": _raise(ValueError(f"the database refuses this: {MARK}")),
    "poison.refused_success": _returns({"note": MARK}),
}
