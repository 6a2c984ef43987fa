"""How a worker runs: its settings (checked at construction) and its reconnect back-off."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass

from sqlqueue._errors import ConfigurationError

__all__ = ["WorkerSettings", "reconnect_delay"]


@dataclass(frozen=True, kw_only=True)
class WorkerSettings:
    """How a worker runs; checked at construction."""

    #: Queue names sharing ``concurrency`` slots, or a mapping of queue name to its own slots.
    queues: tuple[str, ...] | Mapping[str, int] | None = None
    concurrency: int = 4
    poll_interval: float = 1.0
    shutdown_timeout: float = 30.0
    reaper_interval: float | None = None
    #: LISTEN for wake-ups (PostgreSQL); ``False`` polls only, for PgBouncer in transaction mode.
    listen: bool = True

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ConfigurationError(f"concurrency must be >= 1, got {self.concurrency!r}")
        if self.poll_interval <= 0:
            raise ConfigurationError(f"poll_interval must be > 0, got {self.poll_interval!r}")
        if self.shutdown_timeout < 0:
            raise ConfigurationError(
                f"shutdown_timeout must be >= 0, got {self.shutdown_timeout!r}"
            )
        if self.reaper_interval is not None and self.reaper_interval <= 0:
            raise ConfigurationError(f"reaper_interval must be > 0, got {self.reaper_interval!r}")
        if not isinstance(self.listen, bool):
            raise ConfigurationError(f"listen must be True or False, got {self.listen!r}")
        if self.queues is not None and (not self.queues or not all(self.queues)):
            raise ConfigurationError(f"queues must be non-empty names, got {self.queues!r}")
        if self.queues is not None and isinstance(self.queues, str):
            raise ConfigurationError(f"queues must be a list of names, not {self.queues!r}")


def reconnect_delay(failures: int) -> float:
    """Seconds to wait after ``failures`` database errors in a row: 0.5 s doubling to 30 s."""
    base: float = min(30.0, 0.5 * 2.0 ** min(failures - 1, 10))
    return base * random.uniform(0.8, 1.2)
