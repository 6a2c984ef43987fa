"""Enqueue: check each request, then write its row in the caller's transaction.

Every check happens before any SQL is sent, so a rejected request leaves no row and the
caller's transaction usable. Every enqueue path passes :func:`check_job`, which is also where a
task's secret fields are sealed. The INSERTs themselves live in the store.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy.orm import Session, scoped_session

from sqlqueue._arguments import check_arguments
from sqlqueue._batch import Batch
from sqlqueue._errors import ConfigurationError, EnqueueError, UnknownJobType
from sqlqueue._expiry import expiry_of
from sqlqueue._jobrow import JobRow
from sqlqueue._limits import check_enqueue, check_text
from sqlqueue._middleware import EnqueueHook
from sqlqueue._payload import encode_payload
from sqlqueue._schema import jobs
from sqlqueue._secret_keys import keyed_limit_key, secret_unique_keys
from sqlqueue._store.batches import create_batch
from sqlqueue._store.inserts import insert_committed, insert_rows
from sqlqueue._store.transactions import translated
from sqlqueue._tags import check_tags
from sqlqueue._task import DEFAULT_MAX_ATTEMPTS, JobRequest, Task
from sqlqueue._unique import Unique, UniqueCheck, unique_key
from sqlqueue.dialects import Dialect

__all__ = [
    "EnqueueSettings",
    "Executable",
    "build_row",
    "check_batch_children",
    "check_job",
    "enqueue_batch",
    "register_connection_type",
    "to_connection",
    "write_rows",
]

#: What ``enqueue`` writes through: the caller's connection or ORM session (a scoped session,
#: such as Flask-SQLAlchemy's ``db.session``, is its current session), or an engine, which
#: then gets a transaction of its own.
Executable = Connection | Session | scoped_session[Any] | Engine


#: How to write through another library's connection: its type, and a context manager that
#: yields the SQLAlchemy ``Connection`` of that connection's current transaction.
ConnectionAdapter = Callable[[Any], AbstractContextManager[Connection]]

#: The adapters registered by integrations (``sqlqueue.django`` registers Django's
#: connections), so that the core names no framework.
_ADAPTERS: dict[type[Any], ConnectionAdapter] = {}


def register_connection_type(cls: type[Any], adapter: ConnectionAdapter) -> None:
    """Make enqueue write through instances of ``cls`` (and its subclasses) with ``adapter``.

    The adapter must put the job in the transaction the connection is in, on that same
    database connection: the guarantee is the one a SQLAlchemy ``Connection`` gives."""
    _ADAPTERS[cls] = adapter


def _adapter_for(target: object) -> ConnectionAdapter | None:
    for cls in type(target).__mro__:
        adapter = _ADAPTERS.get(cls)
        if adapter is not None:
            return adapter
    return None


@dataclass(frozen=True, kw_only=True)
class EnqueueSettings:
    """What enqueue needs from its queue: the registry, defaults and limits."""

    tasks: Mapping[str, Task]
    default_queue: str
    max_payload_bytes: int
    dialect: Dialect
    #: The queue's ``on_enqueue`` hooks, in order.
    hooks: Sequence[EnqueueHook] = ()


@contextmanager
def to_connection(target: Executable) -> Iterator[Connection]:
    """The connection of the caller's transaction (an engine gets a transaction of its own)."""
    if isinstance(target, Connection):
        yield target
    elif isinstance(target, Session):
        yield target.connection()
    elif isinstance(target, scoped_session):
        yield target.connection()  # the current scope's session
    elif isinstance(target, Engine):
        with target.begin() as conn:
            yield conn
    else:
        adapter = _adapter_for(target)
        if adapter is None:
            raise ConfigurationError(
                "enqueue writes in your transaction: pass a SQLAlchemy Connection or Session "
                f"(or an Engine for a transaction of its own), got {type(target).__name__} "
                '(a Django connection needs "sqlqueue.django" in INSTALLED_APPS)'
            )
        with adapter(target) as conn:
            yield conn


def build_row(settings: EnqueueSettings, request: JobRequest) -> JobRow:
    """Check one request and turn it into insert parameters; raise before any SQL is sent."""
    return check_job(  # positionally: this runs once per job of an ``enqueue_many``
        settings.tasks,
        settings.default_queue,
        settings.max_payload_bytes,
        request.job_type,
        request.payload,
        request.idempotency_key,
        request.group_key,
        request.delay,
        request.run_at,
        request.priority,
        request.queue,
        request.max_attempts,
        request.external,
        settings.hooks,
        request.unique,
        request.expires_in,
        request.expires_at,
        request.tags,
    )


def check_job(
    tasks: Mapping[str, Task],
    default_queue: str,
    max_payload_bytes: int,
    job_type: str,
    payload: Mapping[str, Any] | None,
    idempotency_key: str | None = None,
    group_key: str | None = None,
    delay: float | None = None,
    run_at: datetime | None = None,
    priority: int | None = None,
    queue: str | None = None,
    max_attempts: int | None = None,
    external: bool = False,
    hooks: Sequence[EnqueueHook] = (),
    unique: Unique | None = None,
    expires_in: float | None = None,
    expires_at: datetime | None = None,
    tags: Sequence[str] | None = None,
) -> JobRow:
    """:func:`build_row` from the request's fields and the queue's settings, given one by one:
    ``Queue.enqueue`` builds neither a request nor an :class:`EnqueueSettings` per job. The
    queue's ``on_enqueue`` ``hooks`` see the request first (only then is one built)."""
    if hooks:
        request = run_hooks(
            hooks,
            JobRequest(
                job_type=job_type,
                payload={} if payload is None else payload,
                idempotency_key=idempotency_key,
                group_key=group_key,
                delay=delay,
                run_at=run_at,
                priority=priority,
                queue=queue,
                max_attempts=max_attempts,
                external=external,
                unique=unique,
                expires_in=expires_in,
                expires_at=expires_at,
                tags=tags,
            ),
        )
        job_type, payload = request.job_type, request.payload
        idempotency_key, group_key = request.idempotency_key, request.group_key
        delay, run_at, priority = request.delay, request.run_at, request.priority
        queue, max_attempts, external = request.queue, request.max_attempts, request.external
        unique = request.unique
        expires_in, expires_at = request.expires_in, request.expires_at
        tags = request.tags
    delay_seconds = check_enqueue(
        job_type, idempotency_key, group_key, delay, run_at, priority, queue, max_attempts
    )
    expiry = expiry_of(expires_in, expires_at)
    task = tasks.get(job_type)
    if task is None and not external:
        known = ", ".join(sorted(tasks)) or "none"
        raise UnknownJobType(
            f"no task named {job_type!r} on this queue (known: {known}); pass "
            "external=True if another service's workers handle it"
        )
    if task is not None and not external:
        check_arguments(task, payload)
    limit_key = None
    if task is not None and task.concurrency is not None:
        # From the payload as given: a key function never sees sealed ciphertext.
        limit_key = task.concurrency.key_for(job_type, {} if payload is None else payload)
        check_text("Concurrency.key", limit_key, jobs.c.limit_key, EnqueueError, empty=True)
    all_tags = check_tags(tags, EnqueueError, base=task.tags if task is not None else ())
    if unique is None and task is not None:
        unique = task.unique
    key = check = None
    if unique is not None:
        if not isinstance(unique, Unique):
            raise EnqueueError(f"unique must be a sqlqueue.Unique, got {unique!r}")
        if task is None or task.secrets is None:
            key = unique_key(job_type, unique, payload or {})
            check = UniqueCheck(
                states=tuple(unique.states), replace=unique.on_conflict == "replace"
            )
        else:  # read from a secret field, an HMAC by each encryption key (rotations keep it)
            key, *older = secret_unique_keys(task.secrets, job_type, unique, payload or {})
            check = UniqueCheck(
                states=tuple(unique.states),
                replace=unique.on_conflict == "replace",
                also=tuple(older),
            )
    if task is not None and task.secrets is not None:
        if limit_key:  # a key read from a secret field is stored as a keyed hash
            limit_key = keyed_limit_key(task.secrets, task.concurrency, payload or {}, limit_key)
        # Sealed before the size check and the write: only ciphertext reaches the row.
        payload = task.secrets.seal(payload)
    encoded = encode_payload(payload, max_bytes=max_payload_bytes)
    if max_attempts is None:
        max_attempts = task.max_attempts if task else DEFAULT_MAX_ATTEMPTS
    if priority is None:
        priority = task.priority if task else 0
    if not queue:
        queue = task.queue if task else default_queue
    return {
        "job_type": job_type,
        "queue": queue,
        "priority": priority,
        "payload": encoded,
        "max_attempts": max_attempts,
        "idempotency_key": idempotency_key,
        "group_key": group_key,
        "trace_context": None,  # the enqueue's span fills it, when tracing is on
        "batch_id": None,
        "limit_key": limit_key,
        "unique_key": key,
        "expires_at": expiry,
        "_unique": check,
        "_tags": all_tags,
        "_run_at": run_at,
        "_delay": delay_seconds,
    }


def run_hooks(hooks: Sequence[EnqueueHook], request: JobRequest) -> JobRequest:
    """``request`` through each ``on_enqueue`` hook in turn; a hook returning anything but a
    :class:`~sqlqueue.JobRequest` is a mistake named here."""
    for hook in hooks:
        request = hook(request)
        if not isinstance(request, JobRequest):
            name = getattr(hook, "__qualname__", repr(hook))
            raise ConfigurationError(
                f"the on_enqueue hook {name} returned {type(request).__name__}, not the "
                "sqlqueue.JobRequest to write (return the request, or raise EnqueueError)"
            )
    return request


def write_rows(dialect: Dialect, target: Executable, rows: list[JobRow]) -> list[int]:
    """Insert checked ``rows`` in the caller's transaction; one id per row, in order."""
    if not rows:
        return []
    if isinstance(target, Connection):  # the common case, without a context manager
        dialect.check_connection(target)
        return translated(dialect, lambda: insert_rows(dialect, target, rows))
    if isinstance(target, Engine) and len(rows) == 1:
        # A transaction of sqlqueue's own for one job: straight on a pooled connection
        # where nothing would notice the difference from ``engine.begin()``.
        dialect.check_connection(target)
        job_id = translated(dialect, lambda: insert_committed(dialect, target, rows[0]))
        if job_id is not None:
            return [job_id]

    def write() -> list[int]:
        with to_connection(target) as conn:
            dialect.check_connection(conn)
            return insert_rows(dialect, conn, rows)

    return translated(dialect, write)


def check_batch_children(settings: EnqueueSettings, requests: object) -> list[JobRow]:
    """Check the children of a batch as any enqueue does, and refuse idempotency keys: a child
    whose key an existing job holds would not be written, and the batch would wait for a job
    that is not its own."""
    if isinstance(requests, JobRequest | str | bytes | Mapping) or not isinstance(
        requests, Iterable
    ):
        raise EnqueueError(
            "a batch's children must be a list of sqlqueue.JobRequest, got "
            f"{type(requests).__name__} (wrap a single request in a list)"
        )
    rows: list[JobRow] = []
    for index, request in enumerate(requests):
        if not isinstance(request, JobRequest):
            raise EnqueueError(
                f"batch child {index} must be a sqlqueue.JobRequest, got {type(request).__name__}"
            )
        if request.idempotency_key is not None:
            raise EnqueueError(
                f"batch child {index} ({request.job_type}) has an idempotency_key: children of "
                "a batch cannot have one (an existing job with that key is not this batch's); "
                "make the code that creates the batch idempotent instead"
            )
        row = build_row(settings, request)
        if row["unique_key"] is not None:
            raise EnqueueError(
                f"batch child {index} ({request.job_type}) is unique (sqlqueue.Unique): "
                "children of a batch cannot be (an existing job kept in its place is not this "
                "batch's); enqueue it outside the batch"
            )
        rows.append(row)
    return rows


def _check_callback(settings: EnqueueSettings, name: str, request: object) -> JobRow | None:
    """The checked callback job ``name`` (``on_complete`` or ``on_dead``), or ``None``."""
    if request is None:
        return None
    if not isinstance(request, JobRequest):
        raise EnqueueError(
            f"{name} must be a sqlqueue.JobRequest (or None), got {type(request).__name__}"
        )
    if request.idempotency_key is not None:
        raise EnqueueError(
            f"{name} has an idempotency_key: a batch's callback is enqueued exactly once "
            "already; leave it out"
        )
    return build_row(settings, request)


def enqueue_batch(
    settings: EnqueueSettings,
    target: Executable,
    requests: Iterable[JobRequest],
    *,
    on_complete: JobRequest | None,
    on_dead: JobRequest | None,
    send: Callable[[Sequence[JobRow], Callable[[], list[int]]], list[int]] | None = None,
) -> Batch:
    """Write a batch row and its children in the caller's transaction (every request checked
    first: a bad one writes nothing).

    ``send`` (the queue's producer span, when tracing is on) runs the write around the
    children, which it gives its trace context; the callbacks carry the same context, so
    they join the trace of the code that started the batch. An empty batch enqueues its
    ``on_complete`` at once: then that is what the span is sent around.
    """
    children = check_batch_children(settings, requests)
    complete_row = _check_callback(settings, "on_complete", on_complete)
    dead_row = _check_callback(settings, "on_dead", on_dead)
    dialect = settings.dialect
    sent = children or ([complete_row] if complete_row is not None else [])

    def write() -> Batch:
        if sent:
            for callback in (complete_row, dead_row):
                if callback is not None:
                    callback["trace_context"] = sent[0]["trace_context"]
        with to_connection(target) as conn:
            dialect.check_connection(conn)
            batch_id, ids = create_batch(
                conn, dialect, children=children, on_complete=complete_row, on_dead=dead_row
            )
        return Batch(id=batch_id, job_ids=tuple(ids))

    if send is None or not sent:
        return translated(dialect, write)
    written: list[Batch] = []

    def write_ids() -> list[int]:
        written.append(translated(dialect, write))
        return list(written[0].job_ids)  # none for an empty batch: its callback has no id here

    send(sent, write_ids)
    return written[0]
