"""A worker's Prometheus metrics, served on ``/metrics`` (extra ``prometheus``).

Loaded only by a worker started with ``metrics_port``: a worker without it never imports
``prometheus_client`` and pays one ``if`` per outcome. The outcome counters and histograms are
updated where every written outcome passes (the worker's ``_on_written``); the handler calls'
(begun, running, their duration) by the built-in ``metrics`` middleware around each call
(:class:`CallTally`, sqlqueue/_worker/call_metrics.py); the queue gauges come from
the operations API's :meth:`~sqlqueue.Queue.stats`, read at most once per ``stats_interval``
however often the endpoint is scraped, and never per job.
"""

from __future__ import annotations

import logging
import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Iterator, Mapping
from itertools import accumulate
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from sqlqueue._errors import ConfigurationError
from sqlqueue._operators.stats import Stats
from sqlqueue._store.rows import ClaimedJob
from sqlqueue._worker.classify import Outcome

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

__all__ = ["CallTally", "WorkerMetrics"]

log = logging.getLogger("sqlqueue.worker")

#: Upper bounds (``le``) of the histograms' buckets, in seconds.
_DURATION_BUCKETS: tuple[float, ...] = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    300,
    900,
)
_WAIT_BUCKETS: tuple[float, ...] = (
    0.01,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    300,
    900,
    3600,
)


class WorkerMetrics:
    """One worker's metrics in a registry of its own, and the HTTP server that serves them."""

    def __init__(
        self,
        *,
        port: int,
        stats: Callable[[], Stats],
        stats_interval: float,
        addr: str = "0.0.0.0",
    ) -> None:
        self.registry = CollectorRegistry()
        self._tally = OutcomeTally()
        self.registry.register(self._tally)
        #: The built-in ``metrics`` middleware's meter of this worker's handler calls.
        self.calls = CallTally()
        self.registry.register(self.calls)
        self.registry.register(QueueGauges(stats, stats_interval))
        self._port = port
        self._addr = addr
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> int:
        """Serve ``/metrics``; return the port (the one chosen, for ``port=0``)."""
        try:
            self._server, self._thread = start_http_server(
                self._port, addr=self._addr, registry=self.registry
            )
        except OSError as error:
            raise ConfigurationError(
                f"cannot serve metrics on port {self._port}: {error}; choose another "
                "metrics_port (--metrics-port)"
            ) from error
        port: int = self._server.server_port
        log.info("serving Prometheus metrics on port %d (/metrics)", port)
        return port

    def stop(self) -> None:
        """Stop serving."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def record(self, outcome: Outcome, name: str) -> None:
        """Count one written attempt under ``name`` (its ``outcome_name``, the ``outcome``
        label) and observe its duration and its job's wait."""
        self._tally.record(outcome, name)


class OutcomeTally(Collector):
    """``sqlqueue_jobs_total``, ``sqlqueue_job_duration_seconds`` and
    ``sqlqueue_job_wait_seconds``, kept as plain numbers and turned into metric families when
    scraped.

    prometheus_client's own ``Counter`` and ``Histogram`` (a label lookup and a lock per metric)
    cost twice as much per outcome, about a tenth of a no-op job's CPU. Here an outcome is a
    dict lookup, two bisections and a few additions under one lock (the scrape thread reads
    them under it too).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: dict[tuple[str, str, str], int] = {}
        #: Per label set: the count of each bucket (not cumulative; the last is ``+Inf``), and
        #: the sum of the observed values.
        self._duration: dict[tuple[str, str], tuple[list[int], list[float]]] = {}
        self._wait: dict[str, tuple[list[int], list[float]]] = {}

    def record(self, outcome: Outcome, name: str) -> None:
        """Count one written attempt as ``name`` and observe its duration and wait."""
        job = outcome.job
        elapsed = outcome.elapsed
        wait = max(0.0, (job.started_at - job.next_run_at).total_seconds())
        with self._lock:
            key = (job.queue, job.job_type, name)
            self._jobs[key] = self._jobs.get(key, 0) + 1
            duration = self._duration.get(key[:2]) or self._duration.setdefault(
                key[:2], _empty(_DURATION_BUCKETS)
            )
            duration[0][bisect_left(_DURATION_BUCKETS, elapsed)] += 1
            duration[1][0] += elapsed
            waits = self._wait.get(job.queue) or self._wait.setdefault(
                job.queue, _empty(_WAIT_BUCKETS)
            )
            waits[0][bisect_left(_WAIT_BUCKETS, wait)] += 1
            waits[1][0] += wait

    def describe(self) -> Iterator[Metric]:
        """The three families (empty)."""
        return iter(self._families({}, {}, {}))

    def collect(self) -> Iterator[Metric]:
        """The counts so far."""
        with self._lock:
            jobs = dict(self._jobs)
            duration: dict[tuple[str, ...], tuple[list[int], float]] = {
                key: (list(b), s[0]) for key, (b, s) in self._duration.items()
            }
            wait: dict[tuple[str, ...], tuple[list[int], float]] = {
                (key,): (list(b), s[0]) for key, (b, s) in self._wait.items()
            }
        return iter(self._families(jobs, duration, wait))

    @staticmethod
    def _families(
        jobs: dict[tuple[str, str, str], int],
        duration: Mapping[tuple[str, ...], tuple[list[int], float]],
        wait: Mapping[tuple[str, ...], tuple[list[int], float]],
    ) -> list[Metric]:
        counter = CounterMetricFamily(
            "sqlqueue_jobs",
            "Attempts whose outcome this worker wrote, by queue, job type and outcome.",
            labels=["queue", "job_type", "outcome"],
        )
        for labels, count in sorted(jobs.items()):
            counter.add_metric(list(labels), count)
        return [
            counter,
            _histogram(
                "sqlqueue_job_duration_seconds",
                "How long attempts ran, from the handler's start to its outcome.",
                ["queue", "job_type"],
                _DURATION_BUCKETS,
                duration,
            ),
            _histogram(
                "sqlqueue_job_wait_seconds",
                "How long jobs waited from due (next_run_at) to started, by the database clock.",
                ["queue"],
                _WAIT_BUCKETS,
                wait,
            ),
        ]


class CallTally(Collector):
    """``sqlqueue_attempts_started_total``, ``sqlqueue_attempts_in_progress`` and
    ``sqlqueue_handler_duration_seconds``, by queue and job type: the handler calls the
    built-in ``metrics`` middleware saw begin and end (a :class:`~sqlqueue._worker.call_metrics.
    CallMeter`), kept as plain numbers under one lock, as :class:`OutcomeTally` keeps its own.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._started: dict[tuple[str, str], int] = {}
        self._running: dict[tuple[str, str], int] = {}
        self._duration: dict[tuple[str, str], tuple[list[int], list[float]]] = {}

    def begin(self, job: ClaimedJob) -> float:
        """A handler call of ``job`` begins: count it, and it runs; return its start."""
        key = (job.queue, job.job_type)
        with self._lock:
            self._started[key] = self._started.get(key, 0) + 1
            self._running[key] = self._running.get(key, 0) + 1
        return self._clock()

    def end(self, job: ClaimedJob, began: float) -> None:
        """That call returned or raised: it no longer runs; observe how long it took."""
        elapsed = self._clock() - began
        key = (job.queue, job.job_type)
        with self._lock:
            self._running[key] -= 1
            duration = self._duration.get(key) or self._duration.setdefault(
                key, _empty(_DURATION_BUCKETS)
            )
            duration[0][bisect_left(_DURATION_BUCKETS, elapsed)] += 1
            duration[1][0] += elapsed

    def describe(self) -> Iterator[Metric]:
        """The three families (empty)."""
        return iter(self._families({}, {}, {}))

    def collect(self) -> Iterator[Metric]:
        """The counts so far."""
        with self._lock:
            started = dict(self._started)
            running = dict(self._running)
            duration: dict[tuple[str, ...], tuple[list[int], float]] = {
                key: (list(b), s[0]) for key, (b, s) in self._duration.items()
            }
        return iter(self._families(started, running, duration))

    @staticmethod
    def _families(
        started: dict[tuple[str, str], int],
        running: dict[tuple[str, str], int],
        duration: Mapping[tuple[str, ...], tuple[list[int], float]],
    ) -> list[Metric]:
        labels = ["queue", "job_type"]
        begun = CounterMetricFamily(
            "sqlqueue_attempts_started",
            "Handler calls this worker began, by queue and job type.",
            labels=labels,
        )
        for key, count in sorted(started.items()):
            begun.add_metric(list(key), count)
        now = GaugeMetricFamily(
            "sqlqueue_attempts_in_progress",
            "Handler calls running in this worker now, by queue and job type.",
            labels=labels,
        )
        for key, count in sorted(running.items()):
            now.add_metric(list(key), count)
        return [
            begun,
            now,
            _histogram(
                "sqlqueue_handler_duration_seconds",
                "How long handler calls took (the app's middleware included), whatever came "
                "of them.",
                labels,
                _DURATION_BUCKETS,
                duration,
            ),
        ]


def _empty(bounds: tuple[float, ...]) -> tuple[list[int], list[float]]:
    return [0] * (len(bounds) + 1), [0.0]


def _histogram(
    name: str,
    documentation: str,
    labels: list[str],
    bounds: tuple[float, ...],
    series: Mapping[tuple[str, ...], tuple[list[int], float]],
) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, documentation, labels=labels)
    edges = [repr(float(bound)) for bound in bounds] + ["+Inf"]  # as prometheus_client spells them
    for label_values, (counts, total) in sorted(series.items()):
        buckets = list(zip(edges, accumulate(counts), strict=True))
        family.add_metric(list(label_values), buckets, sum_value=total)
    return family


class QueueGauges(Collector):
    """``sqlqueue_queue_jobs{queue,status}`` and ``sqlqueue_queue_oldest_age_seconds{queue}``
    from :meth:`~sqlqueue.Queue.stats`, read at most once per ``interval`` seconds (scrapes in
    between see the last read). A read that fails is logged and yields no samples."""

    def __init__(
        self,
        stats: Callable[[], Stats],
        interval: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._stats = stats
        self._interval = interval
        self._clock = clock
        self._lock = threading.Lock()
        self._last: Stats | None = None
        self._read_at: float | None = None

    def describe(self) -> Iterator[Metric]:
        """The two families, without reading the database (at registration)."""
        return iter(self._families(None))

    def collect(self) -> Iterator[Metric]:
        """The gauges, from the last stats read if it is recent enough."""
        return iter(self._families(self._current()))

    def _current(self) -> Stats | None:
        with self._lock:
            now = self._clock()
            if self._read_at is None or now - self._read_at >= self._interval:
                try:
                    self._last = self._stats()
                except Exception as error:
                    log.warning("metrics: could not read the queue's stats: %s", error)
                    self._last = None
                    return None
                self._read_at = now
            return self._last

    @staticmethod
    def _families(stats: Stats | None) -> list[Metric]:
        jobs = GaugeMetricFamily(
            "sqlqueue_queue_jobs", "Jobs in the queue by status.", labels=["queue", "status"]
        )
        age = GaugeMetricFamily(
            "sqlqueue_queue_oldest_age_seconds",
            "How long the oldest due job has waited (0 when none is due).",
            labels=["queue"],
        )
        if stats is not None:
            for name, queue in stats.queues.items():
                for status, count in queue.by_status.items():
                    jobs.add_metric([name, status], count)
                age.add_metric([name], queue.oldest_queued_age_seconds or 0.0)
        return [jobs, age]
