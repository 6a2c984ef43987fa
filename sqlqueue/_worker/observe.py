"""What a worker tells its observers about the attempts it runs: the log line of each written
outcome and, when asked for, Prometheus metrics.

The worker calls :meth:`Observers.written` once per written outcome and
:meth:`Observers.cancel_requested` when heartbeats report cancel requests; everything an
observer needs beyond the outcome (whether a cancel was asked for, for the metrics' label) is
kept here. An observer nobody asked for costs one ``if`` per outcome: ``prometheus_client`` is
imported only by a worker started with ``metrics_port``.
"""

from __future__ import annotations

from collections.abc import Callable, Set
from typing import TYPE_CHECKING

from sqlqueue._stats import Stats
from sqlqueue._worker.classify import Outcome
from sqlqueue._worker.outcome_log import log_outcome
from sqlqueue._worker.settings import WorkerSettings

if TYPE_CHECKING:
    from sqlqueue._worker.prometheus import WorkerMetrics

__all__ = ["Observers"]


class Observers:
    """One worker's observers of its outcomes: the log, and the metrics if served."""

    def __init__(self, worker_id: str) -> None:
        self._worker_id = worker_id
        #: Prometheus metrics, while served (else one ``if`` per outcome).
        self._metrics: WorkerMetrics | None = None
        #: Running jobs someone asked to cancel (heartbeats tell), for the outcome label.
        self._cancel_requested: set[int] = set()

    def start(self, settings: WorkerSettings, stats: Callable[[], Stats]) -> int | None:
        """Serve Prometheus metrics if ``settings.metrics_port`` asks for them (only then is
        ``prometheus_client`` imported); return the port served on."""
        if settings.metrics_port is None:
            return None
        from sqlqueue._worker.prometheus import WorkerMetrics  # the optional extra, when used

        metrics = WorkerMetrics(
            port=settings.metrics_port, stats=stats, stats_interval=settings.metrics_interval
        )
        port = metrics.start()
        self._metrics = metrics
        return port

    def stop(self) -> None:
        """Stop serving metrics."""
        if self._metrics is not None:
            self._metrics.stop()
            self._metrics = None

    def cancel_requested(self, job_ids: Set[int]) -> None:
        """Heartbeats found cancel requests for these running jobs."""
        if self._metrics is not None:
            self._cancel_requested |= job_ids

    def written(self, outcome: Outcome, landed: bool) -> None:
        """One attempt's outcome was written (``landed``) or found stale (its lease lost)."""
        if self._metrics is not None:
            job_id = outcome.job.id
            cancel_requested = job_id in self._cancel_requested
            self._cancel_requested.discard(job_id)
            if landed:  # one that lost its lease is someone else's to count
                self._metrics.record(outcome, cancel_requested=cancel_requested)
        log_outcome(outcome, landed, self._worker_id)
