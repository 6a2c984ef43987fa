"""Skewing a worker process's own wall clock, for the clock-skew fault test.

:func:`install_skew` must run before sqlqueue or SQLAlchemy are imported (the fault worker
launcher does that): it shifts ``time.time``, ``time.time_ns`` and ``datetime.now/utcnow/today``
by a fixed offset, as a host whose clock is wrong would. The monotonic clock is left alone (a
wrong wall clock does not make time pass faster), and so is SQLite's C-level clock: on SQLite
the database clock lives in the same host, so only a clock *Python* reads can disagree with it.

:func:`wall_clock` always reads the true time, so the ledger stays comparable across processes.
"""

from __future__ import annotations

import datetime as _datetime
import time as _time
from typing import Any

__all__ = ["install_skew", "wall_clock"]

_true_time = _time.time
_true_time_ns = _time.time_ns
_TrueDatetime = _datetime.datetime


def wall_clock() -> float:
    """The host's true time (epoch seconds), even in a process whose clock is skewed."""
    return _true_time()


class _SkewedDatetimeType(type):
    """Keeps ``isinstance(real_datetime, datetime)`` true after ``datetime`` is replaced."""

    def __instancecheck__(cls, instance: object) -> bool:
        return isinstance(instance, _TrueDatetime)

    def __subclasscheck__(cls, subclass: type) -> bool:
        return issubclass(subclass, _TrueDatetime)


def install_skew(seconds: float) -> None:
    """Make this process's wall clock run ``seconds`` ahead (negative: behind) of the host's."""
    offset = _datetime.timedelta(seconds=seconds)
    offset_ns = round(seconds * 1e9)

    class SkewedDatetime(_TrueDatetime, metaclass=_SkewedDatetimeType):
        @classmethod
        def now(cls, tz: Any = None) -> Any:
            return _TrueDatetime.now(tz) + offset

        @classmethod
        def utcnow(cls) -> Any:
            return _TrueDatetime.now(_datetime.UTC).replace(tzinfo=None) + offset

        @classmethod
        def today(cls) -> Any:
            return _TrueDatetime.now() + offset

    setattr(_time, "time", lambda: _true_time() + seconds)  # noqa: B010 - patching on purpose
    setattr(_time, "time_ns", lambda: _true_time_ns() + offset_ns)  # noqa: B010
    setattr(_datetime, "datetime", SkewedDatetime)  # noqa: B010
