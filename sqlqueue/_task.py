"""Tasks: a named handler plus the options its jobs are enqueued and retried with."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from sqlqueue._context import JobContext
from sqlqueue._errors import ConfigurationError
from sqlqueue._limits import check_declaration
from sqlqueue._middleware import Middlewares, check_kind
from sqlqueue._policies.backoff import Backoff, as_backoff
from sqlqueue._policies.circuit_breaker import CircuitBreaker
from sqlqueue._policies.concurrency import Concurrency
from sqlqueue._policies.rate_limit import RateLimit
from sqlqueue._secrets import SecretFields
from sqlqueue._tags import check_tags
from sqlqueue._tracing import Tracing
from sqlqueue._unique import Unique
from sqlqueue._worker.pipeline import Plan, plan

if TYPE_CHECKING:
    from sqlqueue._enqueue import Executable

__all__ = [
    "DEFAULT_MAX_ATTEMPTS",
    "EnqueueOptions",
    "JobRequest",
    "Task",
    "TaskCall",
    "make_task",
]

DEFAULT_MAX_ATTEMPTS = 8
Handler = Callable[..., Any]


@dataclass(frozen=True, kw_only=True)
class EnqueueOptions:
    """Per-job overrides given at enqueue time; ``None`` means "the task's default"."""

    idempotency_key: str | None = None
    group_key: str | None = None
    delay: float | None = None
    run_at: datetime | None = None
    priority: int | None = None
    queue: str | None = None
    max_attempts: int | None = None
    #: Overrides the task's ``unique`` for this job.
    unique: Unique | None = None
    #: Cancel the job (reason ``expired``) if it has not started this many seconds from now,
    #: or by this aware datetime.
    expires_in: float | None = None
    expires_at: datetime | None = None
    #: Added to the task's tags.
    tags: Sequence[str] | None = None


@dataclass(frozen=True, kw_only=True)
class JobRequest:
    """One job for :meth:`Queue.enqueue_many`: its type, payload and per-job options."""

    job_type: str
    payload: Mapping[str, Any] = field(default_factory=dict)
    idempotency_key: str | None = None
    group_key: str | None = None
    delay: float | None = None
    run_at: datetime | None = None
    priority: int | None = None
    queue: str | None = None
    max_attempts: int | None = None
    external: bool = False
    #: At most one such job per key (overrides the task's ``unique``; see sqlqueue.Unique).
    unique: Unique | None = None
    #: Cancelled (reason ``expired``) unless started within ``expires_in`` seconds, or by
    #: ``expires_at``.
    expires_in: float | None = None
    expires_at: datetime | None = None
    #: Labels to find the job by (``queue.jobs(tag=…)``), added to the task's.
    tags: Sequence[str] | None = None

    @property
    def options(self) -> EnqueueOptions:
        """The per-job overrides of this request."""
        return EnqueueOptions(
            idempotency_key=self.idempotency_key,
            group_key=self.group_key,
            delay=self.delay,
            run_at=self.run_at,
            priority=self.priority,
            queue=self.queue,
            max_attempts=self.max_attempts,
            unique=self.unique,
            expires_in=self.expires_in,
            expires_at=self.expires_at,
            tags=self.tags,
        )


class Enqueuer(Protocol):
    """What a task needs of the queue it is registered on: a way to enqueue its jobs (so a task
    never holds, or imports, the whole :class:`~sqlqueue.Queue`)."""

    def enqueue(
        self,
        conn: Executable,
        job_type: str,
        payload: Mapping[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
        group_key: str | None = None,
        delay: float | None = None,
        run_at: datetime | None = None,
        priority: int | None = None,
        queue: str | None = None,
        max_attempts: int | None = None,
        unique: Unique | None = None,
        expires_in: float | None = None,
        expires_at: datetime | None = None,
        tags: Sequence[str] | None = None,
    ) -> int:
        """Enqueue one job in ``conn``'s transaction."""

    async def enqueue_async(
        self, conn: Any, job_type: str, payload: Mapping[str, Any] | None = None, **options: Any
    ) -> int:
        """Enqueue one job through an async connection or session."""

    def enqueue_many(self, conn: Executable, requests: Iterable[JobRequest]) -> list[int]:
        """Enqueue many jobs in ``conn``'s transaction."""


@dataclass(frozen=True, kw_only=True, eq=False)
class Task:
    """A job type registered on a queue: ``@queue.task("send_email", queue="mail")``.

    Calling the task calls the handler directly (handy in tests); ``.enqueue`` schedules it.
    """

    name: str
    handler: Handler
    owner: Enqueuer
    queue: str
    priority: int
    max_attempts: int
    timeout: float | None
    backoff: Backoff
    retry_on: tuple[type[BaseException], ...] | None
    #: Gates checked in the database before each attempt (see sqlqueue/_worker/admission.py).
    rate_limit: RateLimit | None = None
    circuit_breaker: CircuitBreaker | None = None
    #: How many of its attempts may run at once across all workers (see _store/limited_claim.py).
    concurrency: Concurrency | None = None
    #: The payload fields sealed at enqueue and opened into the handler's arguments.
    secrets: SecretFields | None = None
    #: At most one job per key among those in some statuses (see sqlqueue/_unique.py).
    unique: Unique | None = None
    #: Tags every job of the task gets (see sqlqueue/_tags.py).
    tags: tuple[str, ...] = ()
    #: The queue's OpenTelemetry spans (``None``: OpenTelemetry is not installed).
    tracing: Tracing | None = None
    #: The queue's middleware (``@queue.middleware``), around every attempt.
    middlewares: Middlewares | None = None
    is_async: bool = field(init=False)
    signature: inspect.Signature = field(init=False)
    #: The name of the parameter annotated ``JobContext``, if the handler asks for one.
    context_parameter: str | None = field(init=False)
    #: What a payload must look like, precomputed for :meth:`payload_fits`.
    _payload_names: tuple[frozenset[str] | None, frozenset[str]] | None = field(
        init=False, repr=False
    )
    #: The steps its attempts go through, decided here once (see sqlqueue/_worker/pipeline.py).
    plan: Plan = field(init=False, repr=False)

    def __post_init__(self) -> None:
        check_declaration(self.name, self.queue, self.priority, self.max_attempts)
        if self.timeout is not None and self.timeout <= 0:
            raise ConfigurationError(f"timeout must be > 0 seconds, got {self.timeout!r}")
        object.__setattr__(self, "is_async", inspect.iscoroutinefunction(self.handler))
        if self.middlewares is not None:
            check_kind(self.middlewares.chain, self.name, self.is_async)
        signature = inspect.signature(self.handler)
        object.__setattr__(self, "signature", signature)
        object.__setattr__(self, "context_parameter", _context_parameter(self.handler, signature))
        object.__setattr__(
            self, "_payload_names", _payload_names(signature, self.context_parameter)
        )
        object.__setattr__(self, "plan", plan(self))

    def replan(self) -> None:
        """Make the plan again: the queue's middleware changed."""
        object.__setattr__(self, "plan", plan(self))

    def payload_fits(self, payload: Mapping[str, Any]) -> bool:
        """Whether ``payload`` binds to the handler's keyword parameters, by set arithmetic
        (``Signature.bind`` per job cost ~10 µs). ``False`` means "not sure": bind to find out."""
        names = self._payload_names
        if names is None:
            return False
        allowed, required = names
        keys = payload.keys()
        return (allowed is None or keys <= allowed) and required <= keys

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.handler(*args, **kwargs)

    def options(self, **options: Any) -> TaskCall:
        """Enqueue with per-job options: ``task.options(delay=60).enqueue(conn, user_id=1)``."""
        try:
            return TaskCall(task=self, options=EnqueueOptions(**options))
        except TypeError as error:
            raise ConfigurationError(f"unknown enqueue option: {error}") from None

    def enqueue(self, conn: Executable, /, **payload: Any) -> int:
        """Write one job of this task in the caller's transaction; return its id."""
        return TaskCall(task=self, options=EnqueueOptions()).enqueue(conn, **payload)

    async def enqueue_async(self, conn: Any, /, **payload: Any) -> int:
        """:meth:`enqueue` for an ``AsyncConnection`` or ``AsyncSession``."""
        return await TaskCall(task=self, options=EnqueueOptions()).enqueue_async(conn, **payload)

    def enqueue_many(self, conn: Executable, payloads: Iterable[Mapping[str, Any]]) -> list[int]:
        """Write many jobs of this task in one round trip; return their ids in order."""
        return TaskCall(task=self, options=EnqueueOptions()).enqueue_many(conn, payloads)

    def retryable(self, error: BaseException) -> bool:
        """Whether ``error`` is worth another attempt under this task's ``retry_on``."""
        return self.retry_on is None or isinstance(error, self.retry_on)


@dataclass(frozen=True, kw_only=True)
class TaskCall:
    """A task with per-job options attached, ready to enqueue."""

    task: Task
    options: EnqueueOptions

    def enqueue(self, conn: Executable, /, **payload: Any) -> int:
        """Enqueue one job with these options."""
        return self.task.owner.enqueue(conn, self.task.name, payload, **_as_kwargs(self.options))

    async def enqueue_async(self, conn: Any, /, **payload: Any) -> int:
        """Enqueue one job with these options through an async connection or session."""
        return await self.task.owner.enqueue_async(
            conn, self.task.name, payload, **_as_kwargs(self.options)
        )

    def enqueue_many(self, conn: Executable, payloads: Iterable[Mapping[str, Any]]) -> list[int]:
        """Enqueue many jobs sharing these options."""
        requests = [
            JobRequest(job_type=self.task.name, payload=payload, **_as_kwargs(self.options))
            for payload in payloads
        ]
        return self.task.owner.enqueue_many(conn, requests)


def _payload_names(
    signature: inspect.Signature, context: str | None
) -> tuple[frozenset[str] | None, frozenset[str]] | None:
    """``(allowed, required)`` keyword names of a payload (``allowed`` is ``None`` for a handler
    taking ``**kwargs``), or ``None`` when positional-only parameters make sets unreliable."""
    allowed: set[str] = set()
    required: set[str] = set()
    takes_any = False
    for name, parameter in signature.parameters.items():
        if name == context:
            continue
        if parameter.kind is parameter.POSITIONAL_ONLY:
            return None
        if parameter.kind is parameter.VAR_KEYWORD:
            takes_any = True
        elif parameter.kind is not parameter.VAR_POSITIONAL:
            allowed.add(name)
            if parameter.default is parameter.empty:
                required.add(name)
    return (None if takes_any else frozenset(allowed)), frozenset(required)


def _context_parameter(handler: Handler, signature: inspect.Signature) -> str | None:
    """The parameter annotated with ``JobContext`` (also as a string annotation), if any."""
    try:
        hints = typing.get_type_hints(handler)
    except Exception:  # unresolvable forward references: fall back to the annotation text
        hints = {}
    for name, parameter in signature.parameters.items():
        annotation = hints.get(name, parameter.annotation)
        if annotation is JobContext or (
            isinstance(annotation, str) and annotation.rsplit(".", 1)[-1] == "JobContext"
        ):
            return name
    return None


def _as_kwargs(options: EnqueueOptions) -> dict[str, Any]:
    return {
        "idempotency_key": options.idempotency_key,
        "group_key": options.group_key,
        "delay": options.delay,
        "run_at": options.run_at,
        "priority": options.priority,
        "queue": options.queue,
        "max_attempts": options.max_attempts,
        "unique": options.unique,
        "expires_in": options.expires_in,
        "expires_at": options.expires_at,
        "tags": options.tags,
    }


def make_task(
    owner: Enqueuer,
    name: str,
    handler: Handler,
    *,
    queue: str,
    priority: int,
    max_attempts: int,
    timeout: float | None,
    backoff: Backoff | Sequence[float] | None,
    retry_on: Iterable[type[BaseException]] | type[BaseException] | None,
    rate_limit: RateLimit | None = None,
    circuit_breaker: CircuitBreaker | None = None,
    secrets: SecretFields | None = None,
    tracing: Tracing | None = None,
    middlewares: Middlewares | None = None,
    concurrency: Concurrency | None = None,
    unique: Unique | None = None,
    tags: Iterable[str] | None = None,
) -> Task:
    """Build a :class:`Task`, normalising backoff and retry_on."""
    if not callable(handler):
        raise ConfigurationError(f"task {name!r}: the handler must be callable, got {handler!r}")
    if rate_limit is not None and not isinstance(rate_limit, RateLimit):
        raise ConfigurationError(f"rate_limit must be a sqlqueue.RateLimit, got {rate_limit!r}")
    if circuit_breaker is not None and not isinstance(circuit_breaker, CircuitBreaker):
        raise ConfigurationError(
            f"circuit_breaker must be a sqlqueue.CircuitBreaker, got {circuit_breaker!r}"
        )
    if concurrency is not None and not isinstance(concurrency, Concurrency):
        raise ConfigurationError(f"concurrency must be a sqlqueue.Concurrency, got {concurrency!r}")
    if unique is not None and not isinstance(unique, Unique):
        raise ConfigurationError(f"unique must be a sqlqueue.Unique, got {unique!r}")
    if isinstance(retry_on, type):
        retry_on = (retry_on,)
    return Task(
        name=name,
        handler=handler,
        owner=owner,
        queue=queue,
        priority=priority,
        max_attempts=max_attempts,
        timeout=timeout,
        backoff=as_backoff(backoff),
        retry_on=tuple(retry_on) if retry_on is not None else None,
        rate_limit=rate_limit,
        circuit_breaker=circuit_breaker,
        concurrency=concurrency,
        secrets=secrets,
        tracing=tracing,
        middlewares=middlewares,
        unique=unique,
        tags=check_tags(tags, ConfigurationError),
    )
