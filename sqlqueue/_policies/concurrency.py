"""``Concurrency``: how many attempts of a task may run at once, in total or per key, across
every worker process and host.

A limited job carries its key in ``sqlqueue_jobs.limit_key`` from enqueue on (``""`` when the
limit covers the whole task). The claim counts what runs under the key while it holds the key's
row lock and leases only what fits (see :mod:`sqlqueue._store.limited_claim`), so a job that
cannot run yet is skipped, never claimed and released, and a slot comes back exactly when its
job stops running (an outcome, a release, or the reaper after a lease expired).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlqueue._errors import ConfigurationError, EnqueueError
from sqlqueue._policies.gatekey import MAX_KEY_LENGTH

__all__ = ["Concurrency", "check_limit"]

#: The largest limit: the ``sqlqueue_queues.max_running`` column is a 32-bit integer.
MAX_LIMIT = 2**31 - 1


def check_limit(field: str, limit: object) -> int:
    """``limit`` as an int of 1..2**31-1, else a ConfigurationError naming ``field``."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise ConfigurationError(f"{field} must be an int of 1..{MAX_LIMIT}, got {limit!r}")
    return limit


@dataclass(frozen=True, kw_only=True)
class Concurrency:
    """At most ``limit`` attempts of a task running at once across all workers.

    ``@queue.task("sync", concurrency=Concurrency(limit=2, key=lambda p: p["tenant_id"]))``
    allows two at once per tenant. ``key`` is a function of the payload returning a string of
    1..255 characters, computed once at enqueue and stored on the job (like ``group_key``);
    without it, the limit covers the whole task.
    """

    limit: int
    key: Callable[[Mapping[str, Any]], str] | None = None

    def __post_init__(self) -> None:
        check_limit("Concurrency.limit", self.limit)
        if self.key is not None and not callable(self.key):
            raise ConfigurationError(
                f"Concurrency.key must be a function of the payload returning a string, "
                f"got {self.key!r}"
            )

    def key_for(self, job_type: str, payload: Mapping[str, Any]) -> str:
        """The key a job of ``job_type`` runs under: ``""`` for a task-wide limit, else the key
        function's answer (an EnqueueError if it raises or returns no usable string)."""
        if self.key is None:
            return ""
        try:
            value = self.key(payload)
        except Exception as error:
            raise EnqueueError(
                f"task {job_type!r}: Concurrency.key raised {type(error).__name__}: {error}"
            ) from error
        if not isinstance(value, str) or not 1 <= len(value) <= MAX_KEY_LENGTH:
            raise EnqueueError(
                f"task {job_type!r}: Concurrency.key returned {value!r}; it must return a "
                f"string of 1..{MAX_KEY_LENGTH} characters"
            )
        return value
