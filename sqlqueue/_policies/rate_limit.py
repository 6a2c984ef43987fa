"""``RateLimit``: how often a task's jobs may start, per key, across every worker.

The state is a token bucket per key in ``sqlqueue_rate_limits``, refilled by the database clock
and taken with one atomic statement before the handler runs (see
:mod:`sqlqueue._store.token_buckets`). A job over the limit is snoozed until its token is due: it
is deferred, not failed, and the attempt does not count.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlqueue._errors import ConfigurationError
from sqlqueue._policies.gatekey import GateKey, check_key, is_positive_number

__all__ = ["RateLimit"]


@dataclass(frozen=True, kw_only=True)
class RateLimit:
    """At most ``per_second`` job starts per second per key, in bursts of up to ``burst``.

    ``@queue.task("send", rate_limit=RateLimit(per_second=2, key=lambda p: p["endpoint"]))``
    shares one bucket among all workers on all hosts. ``burst`` is how many starts may happen
    back to back after a quiet spell (default: one second's worth, at least 1). ``key`` is a
    string or a function of the payload; the default is the task's name, so the limit covers
    the whole task. Tasks that name the same key share its bucket (give them the same numbers).
    Rates below one per second work too: ``per_second=1/60`` is one a minute.
    """

    per_second: float = 10.0
    burst: float | None = None
    key: GateKey | None = None

    def __post_init__(self) -> None:
        if not is_positive_number(self.per_second):
            raise ConfigurationError(
                f"RateLimit.per_second must be a number > 0, got {self.per_second!r}"
            )
        if self.burst is not None and not (is_positive_number(self.burst) and self.burst >= 1):
            raise ConfigurationError(
                f"RateLimit.burst must be a number >= 1 (or None), got {self.burst!r}"
            )
        check_key("RateLimit.key", self.key)

    @property
    def capacity(self) -> float:
        """The bucket's size: ``burst``, or one second's worth (at least one token)."""
        return float(self.burst) if self.burst is not None else max(1.0, float(self.per_second))
