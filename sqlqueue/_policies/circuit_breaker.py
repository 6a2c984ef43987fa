"""``CircuitBreaker``: stop calling a dependency that keeps failing, per key, across every worker.

States, kept per key in ``sqlqueue_circuit_breakers`` (see :mod:`sqlqueue._store.breaker_states`)::

    closed ──failure_threshold consecutive failures within window_seconds──▶ open
    open ──cooldown_seconds pass; one worker takes the single probe──▶ half_open
    half_open ──the probe succeeds──▶ closed
    half_open ──the probe fails──▶ open (another cool-down)

While the breaker is open, or half-open with its probe in flight, attempts for the key are
snoozed: deferred without counting an attempt. Jobs for other keys are not affected.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlqueue._errors import ConfigurationError, JobTimeout, PermanentError, Retry, Snooze
from sqlqueue._policies.gatekey import GateKey, check_key, is_positive_number

__all__ = ["CircuitBreaker", "counts_as_failure"]


@dataclass(frozen=True, kw_only=True)
class CircuitBreaker:
    """Open after ``failure_threshold`` consecutive failures of a key, the first of them no older
    than ``window_seconds``; defer the key's jobs for ``cooldown_seconds``; then let exactly one
    probe through, whose success closes the breaker and whose failure re-opens it.

    ``key`` is a string or a function of the payload (default: the task's name). What counts as
    a failure is decided by :func:`counts_as_failure`: errors that say the dependency is
    unhealthy, not errors that say the job itself is wrong.
    """

    failure_threshold: int = 5
    window_seconds: float = 60.0
    cooldown_seconds: float = 30.0
    key: GateKey | None = None

    def __post_init__(self) -> None:
        threshold = self.failure_threshold
        if not isinstance(threshold, int) or isinstance(threshold, bool) or threshold < 1:
            raise ConfigurationError(
                f"CircuitBreaker.failure_threshold must be an integer >= 1, got {threshold!r}"
            )
        for field in ("window_seconds", "cooldown_seconds"):
            value = getattr(self, field)
            if not is_positive_number(value):
                raise ConfigurationError(
                    f"CircuitBreaker.{field} must be a number of seconds > 0, got {value!r}"
                )
        check_key("CircuitBreaker.key", self.key)


def counts_as_failure(error: BaseException, *, retryable: bool) -> bool:
    """Whether an attempt that raised ``error`` counts against its breaker.

    Counted: errors the job would be retried for (``Retry`` and ``JobTimeout`` included), also on
    the last attempt, where they kill the job. Not counted: ``Snooze`` (not a failure), and
    ``PermanentError`` or an error outside the task's ``retry_on`` (the job is wrong — bad input,
    a 4xx answer — which says nothing about the dependency's health). ``retryable`` is whether
    the task's ``retry_on`` covers ``error``.
    """
    if isinstance(error, Snooze | PermanentError):
        return False
    if isinstance(error, Retry | JobTimeout):
        return True
    return retryable
