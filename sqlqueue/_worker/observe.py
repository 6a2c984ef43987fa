"""What a worker tells its observers about the attempts it runs: the log line of each written
outcome, the end of its consumer span (OpenTelemetry) and, when asked for, Prometheus metrics.

The worker calls :meth:`Observers.written` once per written outcome, :meth:`Observers.released`
for attempts it gives back at shutdown, and :meth:`Observers.cancel_requested` when heartbeats
report cancel requests; everything an observer needs beyond the outcome (whether a cancel was
asked for, for the outcome's name) is kept here. An observer nobody asked for costs one ``if``
per outcome: ``prometheus_client`` is imported only by a worker started with ``metrics_port``,
and without OpenTelemetry the queue has no tracing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Set
from typing import TYPE_CHECKING

from sqlqueue._operators.stats import Stats
from sqlqueue._store.rows import ClaimedJob
from sqlqueue._tracing import Tracing
from sqlqueue._worker.classify import Outcome, outcome_name
from sqlqueue._worker.outcome_log import log_outcome
from sqlqueue._worker.settings import WorkerSettings

if TYPE_CHECKING:
    from sqlqueue._worker.call_metrics import CallMeter
    from sqlqueue._worker.prometheus import WorkerMetrics

__all__ = ["Observers"]


class Observers:
    """One worker's observers of its outcomes: the log, the consumer spans if the queue
    traces, and the metrics if served."""

    def __init__(self, worker_id: str, tracing: Tracing | None) -> None:
        self._worker_id = worker_id
        self._tracing = tracing
        #: Prometheus metrics, while served (else one ``if`` per outcome).
        self._metrics: WorkerMetrics | None = None
        #: The queue's switch of the built-in ``metrics`` middleware, while metering.
        self._meter_calls: Callable[[str, CallMeter | None], None] | None = None
        #: Running jobs someone asked to cancel (heartbeats tell), for the outcome label.
        self._cancel_requested: set[int] = set()

    def start(
        self,
        settings: WorkerSettings,
        stats: Callable[[], Stats],
        meter_calls: Callable[[str, CallMeter | None], None],
    ) -> int | None:
        """Serve Prometheus metrics if ``settings.metrics_port`` asks for them (only then is
        ``prometheus_client`` imported), and meter this worker's handler calls with the
        built-in ``metrics`` middleware (``meter_calls``: the queue's); return the port."""
        if settings.metrics_port is None:
            return None
        from sqlqueue._worker.prometheus import WorkerMetrics  # the optional extra, when used

        metrics = WorkerMetrics(
            port=settings.metrics_port, stats=stats, stats_interval=settings.metrics_interval
        )
        port = metrics.start()
        self._metrics = metrics
        self._meter_calls = meter_calls
        meter_calls(self._worker_id, metrics.calls)
        return port

    def stop(self) -> None:
        """The worker stopped: stop serving metrics, and end the consumer spans of attempts
        whose outcome it never wrote (see :meth:`Tracing.abandon`)."""
        if self._metrics is not None:
            if self._meter_calls is not None:
                self._meter_calls(self._worker_id, None)
                self._meter_calls = None
            self._metrics.stop()
            self._metrics = None
        self._cancel_requested.clear()
        if self._tracing is not None:
            self._tracing.abandon(self._worker_id)

    def cancel_requested(self, job_ids: Set[int]) -> None:
        """Heartbeats found cancel requests for these running jobs."""
        if self._metrics is not None or self._tracing is not None:
            self._cancel_requested |= job_ids

    def written(self, outcome: Outcome, landed: bool) -> None:
        """One attempt's outcome was written (``landed``) or found stale (its lease lost)."""
        if self._metrics is not None or self._tracing is not None:
            job_id = outcome.job.id
            name = outcome_name(outcome, job_id in self._cancel_requested)
            self._cancel_requested.discard(job_id)
            if self._metrics is not None and landed:  # a lost lease's is someone else's to count
                self._metrics.record(outcome, name)
            if self._tracing is not None:
                self._tracing.finish(outcome, landed, name)
        log_outcome(outcome, landed, self._worker_id)

    def released(self, jobs: Iterable[ClaimedJob]) -> None:
        """These attempts were given back unfinished (shutdown): no outcome will come."""
        if self._tracing is not None:
            for job in jobs:
                self._tracing.release(job)
