"""How a worker runs: its settings, checked at construction (its retries: retries.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from importlib.util import find_spec

from sqlqueue._errors import ConfigurationError

__all__ = ["WorkerSettings"]


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
    #: Serve Prometheus metrics on ``/metrics`` at this port (``0``: any free one); needs the
    #: ``prometheus`` extra. ``None``: no metrics, and ``prometheus_client`` is never imported.
    metrics_port: int | None = None
    #: How often (seconds) the queue gauges re-read :meth:`~sqlqueue.Queue.stats` at most.
    metrics_interval: float = 15.0

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
        if self.metrics_port is not None and (
            isinstance(self.metrics_port, bool)
            or not isinstance(self.metrics_port, int)
            or not 0 <= self.metrics_port <= 65535
        ):
            raise ConfigurationError(
                f"metrics_port must be a port number (0-65535) or None, got {self.metrics_port!r}"
            )
        if self.metrics_interval <= 0:
            raise ConfigurationError(f"metrics_interval must be > 0, got {self.metrics_interval!r}")
        if self.metrics_port is not None and find_spec("prometheus_client") is None:
            raise ConfigurationError(
                "metrics_port needs prometheus-client: "
                "pip install 'sqlalchemy-sqlqueue[prometheus]'"
            )
        if self.queues is not None and (not self.queues or not all(self.queues)):
            raise ConfigurationError(f"queues must be non-empty names, got {self.queues!r}")
