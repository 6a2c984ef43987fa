"""Retry schedules: how long to wait after a failed attempt before the next one.

A backoff maps the number of the attempt that just failed (1 for the first) to a delay in
seconds. Jitter spreads retries of jobs that failed together so they do not return as a herd.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from sqlqueue._errors import ConfigurationError

__all__ = ["Backoff", "Exponential", "Linear", "Schedule", "exponential", "linear", "schedule"]


@runtime_checkable
class Backoff(Protocol):
    """Anything that turns a failed attempt number into the delay before the next attempt."""

    def delay(self, attempt: int) -> float:
        """Seconds to wait after attempt number ``attempt`` (1-based) failed."""
        ...


def _check_non_negative(name: str, value: float) -> None:
    if value < 0:
        raise ConfigurationError(f"{name} must be >= 0, got {value!r}")


def _check_jitter(jitter: float) -> None:
    if not 0.0 <= jitter < 1.0:
        raise ConfigurationError(f"jitter must be in [0, 1), got {jitter!r}")


def _jittered(delay: float, jitter: float, rng: random.Random) -> float:
    if jitter == 0.0 or delay == 0.0:
        return delay
    return max(0.0, delay * (1.0 + rng.uniform(-jitter, jitter)))


@dataclass(frozen=True, kw_only=True)
class Exponential:
    """``base * factor ** (attempt - 1)`` seconds, capped at ``cap``, then ± ``jitter``."""

    base: float = 5.0
    factor: float = 2.0
    cap: float = 3600.0
    jitter: float = 0.1
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def __post_init__(self) -> None:
        _check_non_negative("base", self.base)
        _check_non_negative("cap", self.cap)
        if self.factor < 1.0:
            raise ConfigurationError(f"factor must be >= 1, got {self.factor!r}")
        _check_jitter(self.jitter)

    def delay(self, attempt: int) -> float:
        """Exponential delay for ``attempt``, capped and jittered."""
        exponent = max(attempt - 1, 0)
        try:
            raw = self.base * self.factor**exponent
        except OverflowError:
            raw = self.cap
        return _jittered(min(raw, self.cap), self.jitter, self.rng)


@dataclass(frozen=True, kw_only=True)
class Linear:
    """``base + step * (attempt - 1)`` seconds, capped at ``cap``, then ± ``jitter``."""

    base: float = 5.0
    step: float = 5.0
    cap: float = 3600.0
    jitter: float = 0.1
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def __post_init__(self) -> None:
        _check_non_negative("base", self.base)
        _check_non_negative("step", self.step)
        _check_non_negative("cap", self.cap)
        _check_jitter(self.jitter)

    def delay(self, attempt: int) -> float:
        """Linear delay for ``attempt``, capped and jittered."""
        raw = self.base + self.step * max(attempt - 1, 0)
        return _jittered(min(raw, self.cap), self.jitter, self.rng)


@dataclass(frozen=True, kw_only=True)
class Schedule:
    """Explicit delays: failure n waits ``delays[n-1]``; past the end the last one repeats."""

    delays: tuple[float, ...]
    jitter: float = 0.0
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.delays:
            raise ConfigurationError("a retry schedule needs at least one delay")
        for value in self.delays:
            _check_non_negative("each scheduled delay", value)
        _check_jitter(self.jitter)

    def delay(self, attempt: int) -> float:
        """The scheduled delay for ``attempt``."""
        index = min(max(attempt - 1, 0), len(self.delays) - 1)
        return _jittered(self.delays[index], self.jitter, self.rng)


def exponential(
    *, base: float = 5.0, factor: float = 2.0, cap: float = 3600.0, jitter: float = 0.1
) -> Exponential:
    """The default: 5 s, 10 s, 20 s … up to an hour, each ± 10 %."""
    return Exponential(base=base, factor=factor, cap=cap, jitter=jitter)


def linear(
    *, base: float = 5.0, step: float = 5.0, cap: float = 3600.0, jitter: float = 0.1
) -> Linear:
    """Delays that grow by ``step`` seconds per attempt."""
    return Linear(base=base, step=step, cap=cap, jitter=jitter)


def schedule(delays: Sequence[float], *, jitter: float = 0.0) -> Schedule:
    """Explicit delays such as ``[60, 300, 1800, 7200]``."""
    return Schedule(delays=tuple(float(d) for d in delays), jitter=jitter)


def as_backoff(value: Backoff | Sequence[float] | None) -> Backoff:
    """Accept a backoff object, a list of delays, or ``None`` (the default exponential)."""
    if value is None:
        return exponential()
    if isinstance(value, Backoff):
        return value
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return schedule(value)
    raise ConfigurationError(
        f"backoff must be sqlqueue.exponential(...), linear(...), schedule(...) or a list of "
        f"seconds, got {value!r}"
    )
