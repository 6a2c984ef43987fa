"""Retention: how long finished jobs are kept, per status (the workers' duty that prunes the
rest is ``sqlqueue._worker.retention``)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from sqlqueue._errors import ConfigurationError

__all__ = ["PRUNABLE", "Retention", "check_prunable"]

#: Statuses that may be pruned: finished jobs only, never queued, running or failed ones.
PRUNABLE = ("succeeded", "cancelled", "dead")


def check_prunable(statuses: tuple[str, ...]) -> None:
    """Refuse to prune anything but finished jobs, naming what was asked."""
    wrong = [status for status in statuses if status not in PRUNABLE]
    if wrong or not statuses:
        raise ConfigurationError(
            f"statuses: only finished jobs can be pruned ({', '.join(PRUNABLE)}), got "
            f"{list(statuses)!r}"
        )


@dataclass(frozen=True, kw_only=True)
class Retention:
    """How many seconds finished jobs are kept, per status (``None``: kept for ever), and the
    rows of workers gone without a word (killed, crashed) after their last heartbeat
    (``gone_workers``, a day by default; a worker that stops cleanly deletes its own row).

    ``Queue(retention=Retention(succeeded=7 * 86400, cancelled=7 * 86400, dead=30 * 86400))``
    makes workers prune every ``interval`` seconds, ``batch_size`` rows per transaction.
    Pruning a job frees its idempotency key, and the duty then deletes the lock rows of unique
    keys no job carries any more. A queue without a retention still prunes gone workers' rows
    after a day (and those keys).

    On PostgreSQL, when ``succeeded`` is set, the duty also moves succeeded jobs that nothing
    can act on any more into the history table ``history_after`` seconds after they finished,
    and drops the history's days once they are older than ``succeeded``: such a job is kept
    for ``succeeded`` seconds and at most a day more. With ``succeeded=None`` nothing moves
    (no day would ever be dropped, and the history would gain a table a day for ever).
    """

    succeeded: float | None = None
    cancelled: float | None = None
    dead: float | None = None
    gone_workers: float | None = 86400.0
    interval: float = 60.0
    batch_size: int = 1000
    #: Where the backend keeps a partitioned history (PostgreSQL), succeeded jobs without a
    #: key, batch or workflow move into it this many seconds after they finished, and
    #: retention drops whole days of it (see ``sqlqueue._store.history``); ``None`` (or
    #: ``succeeded=None``): nothing moves, every finished job is pruned in batches as on the
    #: other backends. Keep it ``None`` during a rolling deploy from a release before 0020.
    history_after: float | None = 300.0

    def __post_init__(self) -> None:
        for name in (*PRUNABLE, "gone_workers", "history_after"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ConfigurationError(f"Retention.{name} must be >= 0 seconds, got {value!r}")
        if self.interval <= 0:
            raise ConfigurationError(f"Retention.interval must be > 0, got {self.interval!r}")
        if self.batch_size < 1:
            raise ConfigurationError(f"Retention.batch_size must be >= 1, got {self.batch_size!r}")

    def ages(self) -> Iterator[tuple[str, float]]:
        """``(status, seconds kept)`` for each status that is pruned."""
        for name in PRUNABLE:
            value: float | None = getattr(self, name)
            if value is not None:
                yield name, float(value)
