"""OpenTelemetry tracing (extra ``otel``): a producer span around each enqueue, a consumer span
around each attempt, and the W3C trace context between them on the job row.

An enqueue runs in a ``send <queue>`` span (kind PRODUCER) and stores that span's context
(``traceparent`` and ``tracestate``, as a JSON carrier) in the job's ``trace_context`` column.
Each attempt runs in a ``process <queue>`` span (kind CONSUMER) whose parent is the stored
context, with a link to it too: the attempts join the trace of the request that enqueued the
job, and anything the handler does (its own spans, the jobs it enqueues) nests under them.
The attributes follow the messaging semantic conventions (``messaging.system`` is
``"sqlqueue"``), plus ``sqlqueue.job_type``, ``sqlqueue.attempt`` and ``sqlqueue.outcome``.

The consumer span is started by the ``trace`` step around the handler call (so it is current
on the handler's thread or in its asyncio task) and ended by the worker when the attempt's
outcome is written (sqlqueue/_worker/observe.py): then it knows the outcome as stored —
dead, retried, snoozed, cancelled, timed out — and its error text as ``last_error`` has it,
secrets already scrubbed. ``record_exception`` is not used: it would format the exception
itself, unscrubbed. A worker that stops without writing an attempt's outcome (its ``serve()``
cancelled, the database gone at shutdown) ends that span as ``abandoned``: open spans are held
per worker and never outlive it.

Only ``opentelemetry-api`` is imported. Without it :data:`AVAILABLE` is false, queues get no
:class:`Tracing`, no step is composed, and enqueue writes NULL: nothing runs per job. With the
API but no SDK (the global provider never set, or a ``NoOpTracerProvider``) no span is made
either: an enqueue only stores the current context if a valid one came in (propagated from
upstream), and an attempt asks the provider once.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from importlib import metadata
from typing import TYPE_CHECKING, Any, Final

from sqlqueue._errors import ConfigurationError
from sqlqueue._logs import current_worker
from sqlqueue._middleware import compose
from sqlqueue._payload import JSON_ENCODER

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # the extra is not installed: no spans, NULL trace contexts
    AVAILABLE = False
else:
    AVAILABLE = True

if TYPE_CHECKING:
    from opentelemetry.trace import Span, TracerProvider

    from sqlqueue._jobrow import JobRow
    from sqlqueue._store.rows import ClaimedJob
    from sqlqueue._task import Task
    from sqlqueue._worker.classify import Outcome

__all__ = ["AVAILABLE", "SYSTEM", "Tracing", "trace_step", "tracing_for"]

#: ``messaging.system`` of every span.
SYSTEM: Final = "sqlqueue"

# Attribute names (messaging semantic conventions, then sqlqueue's own).
_SYSTEM: Final = "messaging.system"
_OPERATION_TYPE: Final = "messaging.operation.type"
_OPERATION_NAME: Final = "messaging.operation.name"
_DESTINATION: Final = "messaging.destination.name"
_MESSAGE_ID: Final = "messaging.message.id"
_BATCH_COUNT: Final = "messaging.batch.message_count"
_ERROR_TYPE: Final = "error.type"
_JOB_TYPE: Final = "sqlqueue.job_type"
_ATTEMPT: Final = "sqlqueue.attempt"
_OUTCOME: Final = "sqlqueue.outcome"
_RETRY_IN: Final = "sqlqueue.retry_in_seconds"
#: While no tracer provider is set globally, how long a queue trusts that answer before it
#: asks OpenTelemetry again: asking reads ``os.environ`` each time, which cost a worker of
#: quick jobs about 5 % of its throughput at one ask per enqueue and two per attempt.
_RECHECK_SECONDS: Final = 0.1


def tracing_for(tracer_provider: TracerProvider | None) -> Tracing | None:
    """The tracing of ``Queue(tracer_provider=…)``: on the given provider, or the global one
    (``None``; also when it is set later); no tracing at all without OpenTelemetry."""
    if not AVAILABLE:
        if tracer_provider is not None:
            raise ConfigurationError(
                "tracer_provider: tracing needs opentelemetry-api: "
                "pip install 'sqlalchemy-sqlqueue[otel]'"
            )
        return None
    if tracer_provider is not None and not isinstance(tracer_provider, trace.TracerProvider):
        raise ConfigurationError(
            f"tracer_provider: expected an opentelemetry TracerProvider, got {tracer_provider!r}"
        )
    return Tracing(tracer_provider)


def _version() -> str | None:
    try:
        return metadata.version("sqlalchemy-sqlqueue")
    except metadata.PackageNotFoundError:  # pragma: no cover - run from a source tree
        return None


class Tracing:
    """sqlqueue's spans on one tracer provider."""

    def __init__(self, tracer_provider: TracerProvider | None) -> None:
        self.tracer_provider = tracer_provider
        self._tracer = trace.get_tracer("sqlqueue", _version(), tracer_provider=tracer_provider)
        self._propagator = TraceContextTextMapPropagator()
        #: Consumer spans started by the ``trace`` step, by (job id, attempt), with the id of
        #: the worker that runs them, until that worker writes their outcome or stops (set on
        #: handler threads, popped on the event loop: hence the lock).
        self._open: dict[tuple[int, int], tuple[str | None, Span]] = {}
        self._open_lock = threading.Lock()
        #: Whether the provider records; for the global one, until when that answer holds.
        self._records = tracer_provider is not None and _real(tracer_provider)
        self._recheck_at = 0.0

    def _recording(self) -> bool:
        """Whether spans would go anywhere: an SDK (or another real) provider is in place.

        The global provider can be set once, at any time: until it is, the answer is asked
        again at most every ``_RECHECK_SECONDS`` (spans start at most that late), and once it
        is, never again."""
        if self._records or self.tracer_provider is not None:
            return self._records
        now = time.monotonic()
        if now >= self._recheck_at:
            self._records = _real(trace.get_tracer_provider())
            self._recheck_at = now + _RECHECK_SECONDS
        return self._records

    # -- producer -----------------------------------------------------------------------------

    def send(self, rows: Sequence[JobRow], write: Callable[[], list[int]]) -> list[int]:
        """Run ``write`` (the INSERT of ``rows``) in one producer span, after giving every row
        that span's trace context; return its ids."""
        if not self._recording():  # no span; a context that came from upstream still goes on
            carrier = self._carrier()
            if carrier is not None:
                for row in rows:
                    row["trace_context"] = carrier
            return write()
        queues = {row["queue"] for row in rows}
        job_types = {row["job_type"] for row in rows}
        queue = next(iter(queues)) if len(queues) == 1 else None
        attributes: dict[str, Any] = {
            _SYSTEM: SYSTEM,
            _OPERATION_TYPE: "send",
            _OPERATION_NAME: "send",
        }
        if queue is not None:
            attributes[_DESTINATION] = queue
        if len(job_types) == 1:
            attributes[_JOB_TYPE] = next(iter(job_types))
        if len(rows) != 1:
            attributes[_BATCH_COUNT] = len(rows)
        name = "send" if queue is None else f"send {queue}"
        # Not record_exception: a database error's text can quote the INSERT's parameters,
        # the payload; the span gets the error's type only.
        with self._tracer.start_as_current_span(
            name,
            kind=trace.SpanKind.PRODUCER,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            carrier = self._carrier()
            if carrier is not None:
                for row in rows:
                    row["trace_context"] = carrier
            try:
                ids = write()
            except BaseException as error:
                kind = type(error).__name__
                span.set_attribute(_ERROR_TYPE, kind)
                span.set_status(trace.StatusCode.ERROR, kind)
                raise
            if len(ids) == 1:
                span.set_attribute(_MESSAGE_ID, str(ids[0]))
            return ids

    def stamp(self, rows: Sequence[JobRow]) -> None:
        """Give ``rows`` the current trace context, without a span of their own: the children
        a running attempt adds to its batch, written later in its completion transaction."""
        carrier = self._carrier()
        if carrier is not None:
            for row in rows:
                row["trace_context"] = carrier

    def _carrier(self) -> str | None:
        """The current context as a JSON carrier, or ``None`` when it holds no valid span."""
        carrier: dict[str, str] = {}
        self._propagator.inject(carrier)
        return JSON_ENCODER.encode(carrier) if carrier else None

    # -- consumer -----------------------------------------------------------------------------

    def start_attempt(self, job: ClaimedJob) -> object:
        """Start ``job``'s consumer span, make it current, and return the token that
        :meth:`leave_attempt` takes; the span stays open until :meth:`finish`."""
        if not self._recording():
            return None
        span = self._process_span(job, start_time=None)
        with self._open_lock:
            self._open[job.fence] = (current_worker.get(), span)
        return otel_context.attach(trace.set_span_in_context(span))

    def leave_attempt(self, token: object) -> None:
        """The handler returned (or raised): its span is no longer the current one."""
        if token is not None:
            otel_context.detach(token)  # type: ignore[arg-type]

    def _process_span(self, job: ClaimedJob, start_time: int | None) -> Span:
        parent = self._stored_context(job.trace_context)
        links = []
        if parent is not None:
            stored = trace.get_current_span(parent).get_span_context()
            if stored.is_valid:
                links.append(trace.Link(stored))
        return self._tracer.start_span(
            f"process {job.queue}",
            # An empty context, not the thread's current one: no stored trace, a new trace.
            context=parent if parent is not None else otel_context.Context(),
            kind=trace.SpanKind.CONSUMER,
            links=links,
            start_time=start_time,
            attributes={
                _SYSTEM: SYSTEM,
                _OPERATION_TYPE: "process",
                _OPERATION_NAME: "process",
                _DESTINATION: job.queue,
                _MESSAGE_ID: str(job.id),
                _JOB_TYPE: job.job_type,
                _ATTEMPT: job.attempt,
            },
        )

    def _stored_context(self, stored: str | None) -> otel_context.Context | None:
        """The context of a job row's ``trace_context`` (``None`` if absent or unreadable: a
        row written by hand must not fail its attempt)."""
        if stored is None:
            return None
        try:
            carrier = json.loads(stored)
        except ValueError:
            return None
        if not isinstance(carrier, dict):
            return None
        return self._propagator.extract({str(key): str(value) for key, value in carrier.items()})

    def finish(self, outcome: Outcome, landed: bool, outcome_name: str) -> None:
        """End the attempt's consumer span with its outcome as written (``landed``: the lease
        held). An attempt that never reached its handler (no task for its type, a payload
        that does not fit, a gate that deferred it) gets its span here, spanning its time."""
        job = outcome.job
        span = self._pop(job.fence)
        if span is None:
            if not self._recording():
                return
            started = time.time_ns() - int(outcome.elapsed * 1e9)
            span = self._process_span(job, start_time=started)
        failure = outcome.failure
        span.set_attribute(_OUTCOME, outcome_name if landed else "lease_lost")
        if failure is not None and not failure.snooze:
            entry = failure.errors[-1] if failure.errors else {}
            kind = str(entry.get("kind") or "error")
            event: dict[str, Any] = {
                "exception.type": kind,
                "exception.message": failure.last_error,
            }
            details = entry.get("details")
            if isinstance(details, dict) and isinstance(details.get("traceback"), str):
                event["exception.stacktrace"] = details["traceback"]
            span.add_event("exception", event)
            span.set_attribute(_ERROR_TYPE, kind)
            if not failure.dead:
                span.set_attribute(_RETRY_IN, failure.retry_in)
            span.set_status(trace.StatusCode.ERROR, failure.last_error)
        span.end()

    def release(self, job: ClaimedJob) -> None:
        """End the span of an attempt the worker gave back unfinished (at shutdown)."""
        span = self._pop(job.fence)
        if span is not None:
            span.set_attribute(_OUTCOME, "released")
            span.end()

    def abandon(self, worker_id: str) -> int:
        """End the spans ``worker_id`` still has open: it stopped without writing their
        outcomes (it gave up on the database at shutdown, or its ``serve()`` was cancelled or
        crashed). Their leases expire and the reaper runs them again, in spans of their own.
        Returns how many were ended; without this they would stay open, and held, for as long
        as the queue lives."""
        with self._open_lock:
            fences = [fence for fence, (owner, _) in self._open.items() if owner == worker_id]
            spans = [self._open.pop(fence)[1] for fence in fences]
        for span in spans:
            span.set_attribute(_OUTCOME, "abandoned")
            span.end()
        return len(spans)

    @property
    def open_spans(self) -> int:
        """How many consumer spans are open (started, outcome not yet written)."""
        return len(self._open)

    def _pop(self, fence: tuple[int, int]) -> Span | None:
        if not self._open:  # nothing started (not recording): no lock to take
            return None
        with self._open_lock:
            entry = self._open.pop(fence, None)
        return None if entry is None else entry[1]


def _real(provider: TracerProvider) -> bool:
    """Whether ``provider`` makes spans: not the API's placeholder or no-op provider."""
    return not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)


def trace_step(task: Task, call: Callable[[ClaimedJob, dict[str, Any]], Any]) -> Any:
    """The ``trace`` step of sqlqueue/_worker/pipeline.py: the attempt's consumer span is the
    current span while the handler runs — a built-in middleware, composed like the app's
    (sqlqueue/_middleware.py) but seeing the claimed row, whose trace context it continues."""
    tracing = task.tracing
    assert tracing is not None  # wanted only by tasks of a queue with tracing

    async def traced_async(job: ClaimedJob, call_next: Callable[[], Any]) -> Any:
        token = tracing.start_attempt(job)
        try:
            return await call_next()
        finally:
            tracing.leave_attempt(token)

    def traced_sync(job: ClaimedJob, call_next: Callable[[], Any]) -> Any:
        token = tracing.start_attempt(job)
        try:
            return call_next()
        finally:
            tracing.leave_attempt(token)

    middleware = traced_async if task.is_async else traced_sync
    traced = compose((middleware,), call, is_async=task.is_async, view=_claimed)

    def trace_if_recording(job: ClaimedJob, kwargs: dict[str, Any]) -> Any:
        # Not recording (OpenTelemetry importable, no SDK provider set), the span step does
        # nothing: calling past it saves an async attempt two coroutines and their frames,
        # a per-job cost at 100 jobs in flight. A plain function: the caller awaits what an
        # async call returns.
        if tracing._recording():
            return traced(job, kwargs)
        return call(job, kwargs)

    return trace_if_recording


def _claimed(job: ClaimedJob) -> ClaimedJob:
    return job
