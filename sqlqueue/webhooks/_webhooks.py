"""``Webhooks``: the webhook kind, an ordinary task registered on the app's Queue.

A delivery is one job whose payload holds the endpoint's name, a message id and the exact body
to send (encoded once, at :meth:`Webhooks.deliver`): every attempt sends the same bytes under
the same ``webhook-id``, so receivers can drop duplicates. Each attempt reads its endpoint, signs
the body with the endpoint's current secrets, POSTs it to a checked address, and judges the
answer (see :mod:`sqlqueue.webhooks._policy`). Per-endpoint rate limit and circuit breaker are
sqlqueue's own, database-shared gates keyed by the endpoint's name; a per-process cap on the
deliveries in flight to one endpoint keeps a hanging receiver from taking every worker slot.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import re
import secrets as _random
import ssl
import threading
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from sqlqueue import (
    Backoff,
    CircuitBreaker,
    ConfigurationError,
    JobContext,
    JobRequest,
    PayloadError,
    Queue,
    RateLimit,
    Snooze,
    Task,
    schedule,
)
from sqlqueue._scrub import hide_passwords
from sqlqueue.dialects import dialect_for
from sqlqueue.webhooks import _endpoints
from sqlqueue.webhooks._endpoints import Endpoint, Executable
from sqlqueue.webhooks._errors import DeliveryRefused, DeliveryRejected, UnknownEndpoint
from sqlqueue.webhooks._signing import check_secret, generate_secret, signature_header

__all__ = [
    "DEFAULT_BACKOFF",
    "DEFAULT_CIRCUIT_BREAKER",
    "DEFAULT_MAX_IN_FLIGHT_PER_ENDPOINT",
    "DEFAULT_RATE_LIMIT",
    "TASK_NAME",
    "Webhooks",
]

#: The task every delivery job runs.
TASK_NAME = "sqlqueue.webhooks.deliver"
#: A minute, five, half an hour, two hours, then every five to ten hours: about three days
#: over the default twelve attempts, long enough for a partner to notice and fix an outage.
DEFAULT_BACKOFF = schedule([60, 300, 1800, 7200, 18000, 36000], jitter=0.1)
#: Per endpoint: five deliveries a second, in bursts of ten.
DEFAULT_RATE_LIMIT = RateLimit(per_second=5.0, burst=10)
#: Per endpoint: five failures in a row (within five minutes) pause it for a minute.
DEFAULT_CIRCUIT_BREAKER = CircuitBreaker(
    failure_threshold=5, window_seconds=300.0, cooldown_seconds=60.0
)
#: Per endpoint and worker process: deliveries under way at once. Two keep a steady stream
#: going while the other slots stay free for other endpoints when this one hangs.
DEFAULT_MAX_IN_FLIGHT_PER_ENDPOINT = 2
#: The longest a delivery waits, snoozed, for a slot of its busy endpoint (less with a short
#: ``timeout``: a quarter of it), jittered so the waiting deliveries do not come back together.
_BUSY_RECHECK_SECONDS = 1.0
_MAX_EVENT_TYPE = 200
#: A host as httpx spells it: a DNS name (IDNA already applied), IPv4, or IPv6 without brackets.
_HOST = re.compile(r"[A-Za-z0-9._-]+|[0-9A-Fa-f:.]+")


def _gate_key(payload: Mapping[str, Any]) -> str:
    """Deliveries are gated per endpoint: one slow or broken receiver holds only its own."""
    return f"webhook:{payload['endpoint']}"


def _positive(field: str, value: object) -> float:
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ConfigurationError(f"{field} must be a number of seconds > 0, got {value!r}")
    return float(value)


def _check_max_in_flight(value: object) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigurationError(
            f"max_in_flight_per_endpoint must be an integer >= 1 or None, got {value!r}"
        )
    return value


class _InFlight:
    """The deliveries under way per endpoint in this process, at most ``limit`` each.

    Counted across every worker of the process (they may run on several threads, each with
    its own event loop), so the lock is a thread lock, and it is never held across an await.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def take(self, endpoint: str) -> bool:
        """Count one more delivery to ``endpoint``, unless ``limit`` are already under way."""
        with self._lock:
            held = self._counts.get(endpoint, 0)
            if held >= self.limit:
                return False
            self._counts[endpoint] = held + 1
            return True

    def give_back(self, endpoint: str) -> None:
        with self._lock:
            held = self._counts[endpoint] - 1
            if held:
                self._counts[endpoint] = held
            else:
                del self._counts[endpoint]

    def count(self, endpoint: str) -> int:
        """How many deliveries to ``endpoint`` are under way in this process."""
        with self._lock:
            return self._counts.get(endpoint, 0)


def _check_url(url: object) -> str:
    """``url`` if deliveries can be POSTed to it: absolute http(s), a host, no credentials.
    A refused URL is quoted with its password hidden (``hide_passwords``)."""
    import httpx

    if not isinstance(url, str) or not url or len(url) > 2048:
        shown = hide_passwords(repr(url)) if isinstance(url, str) else repr(url)
        raise ConfigurationError(
            f"url must be an http(s) URL of up to 2048 characters, got {shown}"
        )
    quoted = hide_passwords(repr(url))
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as error:
        raise ConfigurationError(
            f"url {quoted} is malformed: {hide_passwords(str(error))}"
        ) from None
    if parsed.userinfo:
        raise ConfigurationError(f"url {quoted} must not carry credentials; sign with the secret")
    if parsed.scheme not in ("http", "https"):
        raise ConfigurationError(f"url must start with https:// or http://, got {quoted}")
    if not parsed.host:
        raise ConfigurationError(f"url {quoted} has no host")
    if not _HOST.fullmatch(parsed.raw_host.decode("ascii")):
        raise ConfigurationError(f"url {quoted}: {parsed.host!r} is not a host name or address")
    if parsed.fragment:
        raise ConfigurationError(f"url {quoted} must not have a #fragment (it is never sent)")
    return url


class Webhooks:
    """Signed webhook deliveries to partner endpoints, as jobs of ``owner``'s queue.

    Registers the task ``sqlqueue.webhooks.deliver`` on ``owner`` (in queue ``queue``), so any
    worker of that Queue delivers. ``timeout`` bounds a whole attempt (lookup, connection and
    answer); ``max_attempts`` and ``backoff`` say how long a delivery keeps trying;
    ``Retry-After`` is honoured up to ``retry_after_cap`` seconds. ``rate_limit`` and
    ``circuit_breaker`` apply per endpoint (their ``key`` must be left unset; ``None`` turns
    one off). ``max_in_flight_per_endpoint`` caps the deliveries under way to one endpoint
    in each worker process (``None``: no cap); an attempt over it is snoozed for a moment,
    neither counted nor recorded as an error, so an endpoint that hangs holds at most that
    many of a process's slots, whatever its rate limit lets start. With N worker processes an
    endpoint may have N times that many in flight. ``allow_private_addresses=True`` lets
    deliveries reach loopback and private networks: for tests and internal receivers only.
    ``ssl_context`` replaces the default certificate checks (a private CA, say).
    """

    def __init__(
        self,
        owner: Queue,
        /,
        *,
        queue: str = "webhooks",
        timeout: float = 10.0,
        max_attempts: int = 12,
        backoff: Backoff | Sequence[float] = DEFAULT_BACKOFF,
        allow_private_addresses: bool = False,
        retry_after_cap: float = 3600.0,
        rate_limit: RateLimit | None = DEFAULT_RATE_LIMIT,
        circuit_breaker: CircuitBreaker | None = DEFAULT_CIRCUIT_BREAKER,
        max_in_flight_per_endpoint: int | None = DEFAULT_MAX_IN_FLIGHT_PER_ENDPOINT,
        user_agent: str = "sqlqueue-webhooks",
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        try:
            import httpx
        except ImportError:  # pragma: no cover - depends on the installation
            raise ConfigurationError(
                "Webhooks needs httpx: pip install 'sqlalchemy-sqlqueue[webhooks]'"
            ) from None
        if not isinstance(owner, Queue):
            raise ConfigurationError(f"Webhooks needs a sqlqueue.Queue, got {owner!r}")
        self.timeout = _positive("timeout", timeout)
        self.retry_after_cap = _positive("retry_after_cap", retry_after_cap)
        if not isinstance(allow_private_addresses, bool):
            raise ConfigurationError(
                f"allow_private_addresses must be True or False, got {allow_private_addresses!r}"
            )
        self.allow_private_addresses = allow_private_addresses
        for field, gate in (("rate_limit", rate_limit), ("circuit_breaker", circuit_breaker)):
            if gate is not None and gate.key is not None:
                raise ConfigurationError(f"{field}: leave key unset, it is always per endpoint")
        self.rate_limit = replace(rate_limit, key=_gate_key) if rate_limit else None
        self.circuit_breaker = replace(circuit_breaker, key=_gate_key) if circuit_breaker else None
        self.max_in_flight_per_endpoint = _check_max_in_flight(max_in_flight_per_endpoint)
        self._in_flight = (
            _InFlight(self.max_in_flight_per_endpoint)
            if self.max_in_flight_per_endpoint is not None
            else None
        )
        self.user_agent = user_agent
        self.owner = owner
        self._ssl_context = ssl_context or httpx.create_ssl_context()
        self.task: Task = owner.task(
            TASK_NAME,
            queue=queue,
            max_attempts=max_attempts,
            # A safety net only: an attempt ends by itself after `timeout` seconds.
            timeout=self.timeout + 30.0,
            backoff=backoff,
            rate_limit=self.rate_limit,
            circuit_breaker=self.circuit_breaker,
        )(self._deliver_once)

    # -- endpoints ------------------------------------------------------------------------

    def add_endpoint(
        self,
        conn: Executable,
        *,
        name: str,
        url: str,
        secret: str | None = None,
        retry_statuses: Sequence[int] = (),
    ) -> Endpoint:
        """Add a receiver in the caller's transaction; ``secret=None`` generates one (give it to
        the receiver: ``endpoint.secret``). ``retry_statuses`` lists 4xx answers this receiver
        means as "try again later", e.g. ``[404, 409]``. A name already taken, also by a
        transaction still open, is a :class:`sqlqueue.ConfigurationError` (the caller's
        transaction stays usable)."""
        return _endpoints.insert_endpoint(
            conn,
            self.owner.dialect,
            name=_endpoints.check_name(name),
            url=_check_url(url),
            secret=generate_secret() if secret is None else check_secret(secret),
            retry_statuses=_endpoints.check_retry_statuses(retry_statuses),
        )

    def get_endpoint(self, conn: Executable, name: str) -> Endpoint:
        """The endpoint named ``name``, or :class:`UnknownEndpoint`."""
        endpoint = _endpoints.read_endpoint(conn, self.owner.dialect, name)
        if endpoint is None:
            raise UnknownEndpoint(f"no webhook endpoint named {name!r}")
        return endpoint

    def endpoints(self, conn: Executable) -> list[Endpoint]:
        """Every endpoint, by name."""
        return _endpoints.read_endpoints(conn, self.owner.dialect)

    def rotate_secret(
        self, conn: Executable, name: str, grace: float = 86400, *, secret: str | None = None
    ) -> Endpoint:
        """Give endpoint ``name`` a new secret (generated unless given). Deliveries are signed
        with the new and the old ones until ``grace`` seconds pass, so the receiver can switch
        at any moment within it. The endpoint's row stays locked until the caller's
        transaction ends: concurrent rotations take turns, and each keeps the others' new
        secrets."""
        if (
            not isinstance(grace, int | float)
            or isinstance(grace, bool)
            or not math.isfinite(grace)
            or grace < 0
        ):
            raise ConfigurationError(f"grace must be a number of seconds >= 0, got {grace!r}")
        new = generate_secret() if secret is None else check_secret(secret)
        return _endpoints.rotate_secrets(conn, self.owner.dialect, name, secret=new, grace=grace)

    def disable(
        self, conn: Executable, name: str, reason: str = "disabled by an operator"
    ) -> Endpoint:
        """Stop delivering to ``name``: its deliveries go to dead, saying ``reason``."""
        if not isinstance(reason, str) or not reason:
            raise ConfigurationError("disable needs a reason")
        return _endpoints.set_enabled(conn, self.owner.dialect, name, enabled=False, reason=reason)

    def enable(self, conn: Executable, name: str) -> Endpoint:
        """Deliver to ``name`` again (requeue its dead deliveries to send them)."""
        return _endpoints.set_enabled(conn, self.owner.dialect, name, enabled=True, reason=None)

    # -- deliveries -----------------------------------------------------------------------

    def deliver(
        self,
        conn: Executable,
        *,
        endpoint: str,
        event_type: str,
        data: Any,
        idempotency_key: str | None = None,
        delay: float | None = None,
    ) -> int:
        """Enqueue one signed delivery of ``{"type", "timestamp", "data"}`` to ``endpoint``, in
        the caller's transaction; return the job's id.

        Everything is checked before anything is written: an unknown endpoint raises
        :class:`UnknownEndpoint`, data that is not JSON raises :class:`sqlqueue.PayloadError`.
        With an ``idempotency_key`` a kept job already has, that job's id is returned and
        nothing is sent twice. A delivery to a disabled endpoint is enqueued, and goes to dead
        when it runs unless the endpoint is enabled by then.
        """
        request = self.request(
            conn,
            endpoint=endpoint,
            event_type=event_type,
            data=data,
            idempotency_key=idempotency_key,
            delay=delay,
        )
        return self.task.options(idempotency_key=idempotency_key, delay=delay).enqueue(
            conn, **request.payload
        )

    def request(
        self,
        conn: Executable,
        *,
        endpoint: str,
        event_type: str,
        data: Any,
        idempotency_key: str | None = None,
        delay: float | None = None,
    ) -> JobRequest:
        """The delivery :meth:`deliver` would enqueue, as a :class:`sqlqueue.JobRequest` to
        enqueue later with others (a step of a :class:`sqlqueue.Workflow`, ``enqueue_many``).
        Checked as :meth:`deliver` checks it (``conn`` reads the endpoint); writes nothing."""
        if not isinstance(event_type, str) or not 1 <= len(event_type) <= _MAX_EVENT_TYPE:
            raise PayloadError(
                f"event_type must be a string of 1..{_MAX_EVENT_TYPE} characters, "
                f"got {event_type!r}"
            )
        found = _endpoints.read_endpoint(conn, self.owner.dialect, _endpoints.check_name(endpoint))
        if found is None:
            raise UnknownEndpoint(
                f"no webhook endpoint named {endpoint!r}; add it with add_endpoint first"
            )
        timestamp = found.read_at
        try:
            body = json.dumps(
                {
                    "type": event_type,
                    "timestamp": timestamp.astimezone(UTC).isoformat(timespec="milliseconds"),
                    "data": data,
                },
                ensure_ascii=False,
                allow_nan=False,
                separators=(",", ":"),
            )
        except (TypeError, ValueError) as error:
            raise PayloadError(f"webhook data must be JSON: {error}") from None
        return JobRequest(
            job_type=self.task.name,
            payload={
                "endpoint": endpoint,
                "message_id": f"msg_{_random.token_hex(16)}",
                "event_type": event_type,
                "body": body,
            },
            idempotency_key=idempotency_key,
            delay=delay,
        )

    async def deliver_async(
        self,
        conn: Any,
        *,
        endpoint: str,
        event_type: str,
        data: Any,
        idempotency_key: str | None = None,
        delay: float | None = None,
    ) -> int:
        """:meth:`deliver` through an ``AsyncConnection`` or ``AsyncSession`` (same checks, same
        transaction)."""
        job_id: int = await conn.run_sync(
            lambda sync_conn: self.deliver(
                sync_conn,
                endpoint=endpoint,
                event_type=event_type,
                data=data,
                idempotency_key=idempotency_key,
                delay=delay,
            )
        )
        return job_id

    def in_flight(self, endpoint: str) -> int:
        """How many deliveries to ``endpoint`` this process has under way right now."""
        return 0 if self._in_flight is None else self._in_flight.count(endpoint)

    async def _deliver_once(
        self, endpoint: str, message_id: str, event_type: str, body: str, ctx: JobContext
    ) -> dict[str, Any]:
        """One attempt of a delivery (the task's handler); returns what the receiver answered.

        With ``max_in_flight_per_endpoint`` deliveries to ``endpoint`` already under way in
        this process, the attempt snoozes instead: it frees its worker slot at once, so an
        endpoint that hangs cannot take every slot from the others."""
        cap = self._in_flight
        if cap is None:
            return await self._attempt(endpoint, message_id, event_type, body, ctx)
        if not cap.take(endpoint):
            raise Snooze(
                min(_BUSY_RECHECK_SECONDS, self.timeout / 4) * random.uniform(0.5, 1.0),
                reason=f"endpoint {endpoint!r} has {cap.limit} deliveries in flight in this "
                "process (max_in_flight_per_endpoint)",
            )
        try:
            return await self._attempt(endpoint, message_id, event_type, body, ctx)
        finally:
            cap.give_back(endpoint)

    async def _attempt(
        self, endpoint: str, message_id: str, event_type: str, body: str, ctx: JobContext
    ) -> dict[str, Any]:
        from sqlqueue.webhooks._http import post
        from sqlqueue.webhooks._policy import judge

        now = ctx.now()
        found = await asyncio.to_thread(_read_endpoint, ctx, endpoint, now)
        if found is None:
            raise DeliveryRefused(f"endpoint {endpoint!r} no longer exists")
        if not found.enabled:
            raise DeliveryRefused(
                f"endpoint {endpoint!r} is disabled: {found.disabled_reason}; enable it, then "
                "requeue this delivery"
            )
        raw = body.encode("utf-8")
        stamp = int(now.timestamp())
        headers = {
            "content-type": "application/json",
            "user-agent": self.user_agent,
            "webhook-id": message_id,
            "webhook-timestamp": str(stamp),
            "webhook-signature": signature_header(found.secrets, message_id, stamp, raw),
        }
        answer = await post(
            found.url,
            headers=headers,
            body=raw,
            timeout=self.timeout,
            allow_private=self.allow_private_addresses,
            ssl_context=self._ssl_context,
            secrets=found.secrets,
        )
        ctx.logger.debug("%s: %s", event_type, answer.describe())
        try:
            judge(answer, found, now=ctx.now(), retry_after_cap=self.retry_after_cap)
        except DeliveryRejected as rejected:
            if answer.status == 410:
                await asyncio.to_thread(_disable_gone, ctx, endpoint, str(rejected))
            raise
        return {**answer.details(), "message_id": message_id, "summary": answer.describe()}


# The handler's own reads and writes go to the database and schema of the queue that claimed
# the job (``ctx.engine``, ``ctx.schema``): after ``Queue.rebind`` (the CLI's --database-url or
# --schema) that is not the queue this Webhooks was built with.


def _read_endpoint(ctx: JobContext, name: str, now: datetime) -> Endpoint | None:
    with ctx.engine.connect() as conn:
        dialect = dialect_for(ctx.engine, ctx.schema)
        return _endpoints.read_endpoint(conn, dialect, name, now=now)


def _disable_gone(ctx: JobContext, name: str, reason: str) -> None:
    """Disable an endpoint that answered 410, in a transaction of its own: the attempt's
    failure must not roll it back."""
    with ctx.engine.begin() as conn:
        dialect = dialect_for(ctx.engine, ctx.schema)
        _endpoints.set_enabled(conn, dialect, name, enabled=False, reason=reason)
