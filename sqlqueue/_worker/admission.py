"""The gates an attempt passes before its handler runs — its task's circuit breaker, then its
rate limit — and the breaker's bookkeeping once the attempt is over.

A refused attempt raises :class:`~sqlqueue.Snooze`, so the executor's one outcome function puts
the job back to ``queued`` for later without counting the attempt: deferred, not failed. The
gates' state lives in the database (one transaction on the worker's database thread), so every
worker on every host sees the same buckets and breakers. A gate check or a breaker write that
fails is tried again at once, a few times (sqlqueue/_worker/retries.py): a passing database
fault neither defers the job for seconds nor loses what the breaker should learn.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from sqlqueue._errors import DatabaseError, DatabaseUnavailable, PermanentError, Snooze
from sqlqueue._policies.circuit_breaker import CircuitBreaker, counts_as_failure
from sqlqueue._policies.gatekey import GateKey, resolve_key
from sqlqueue._secret_keys import keyed_key, reads_a_secret
from sqlqueue._store.gates import BreakerCheck, RateCheck, Verdict
from sqlqueue._store.rows import ClaimedJob
from sqlqueue._task import Task
from sqlqueue._worker.retries import Backoff, retry_quickly

if TYPE_CHECKING:
    from sqlqueue._worker.attempt import Runtime

__all__ = ["Admission", "admit", "report"]

log = logging.getLogger("sqlqueue.worker")

#: How long an attempt waits when the gates cannot be checked because the database is away.
OUTAGE_DELAY_SECONDS = 2.0
#: Tries of a gate check or a breaker write before giving up on it.
GATE_TRIES = 3


class BadGateKey(PermanentError):
    """A gate's key function failed or returned something unusable for this job's payload."""


@dataclass(frozen=True, kw_only=True)
class Admission:
    """An attempt that passed its task's circuit breaker (``probe``: as the single probe)."""

    job: ClaimedJob
    task: Task
    breaker: CircuitBreaker
    key: str
    probe: bool


async def admit(task: Task, job: ClaimedJob, runtime: Runtime) -> Admission | None:
    """Pass ``job``'s gates, or raise :class:`Snooze` until it may try again.

    Returns what :func:`report` needs when the task has a circuit breaker, else ``None``.
    """
    limit, breaker = task.rate_limit, task.circuit_breaker
    if limit is None and breaker is None:
        return None
    payload = dict(job.payload)
    if task.secrets is not None and (
        (breaker is not None and callable(breaker.key))
        or (limit is not None and callable(limit.key))
    ):
        # The plaintext, as every key function sees it (Concurrency's and Unique's at enqueue);
        # SecretKeyMissing when no key opens it, and the job goes dead saying so.
        payload = dict(task.secrets.opened(payload))
    breaker_key = _key("CircuitBreaker", breaker.key, payload, task) if breaker else None
    rate = (
        RateCheck(
            key=_key("RateLimit", limit.key, payload, task),
            per_second=float(limit.per_second),
            capacity=limit.capacity,
        )
        if limit is not None
        else None
    )
    store = runtime.store
    check = partial(
        store.pass_gates,
        fence=job.fence,
        breaker=BreakerCheck(key=breaker_key) if breaker_key is not None else None,
        rate=rate,
    )
    try:
        verdict = await retry_quickly(
            lambda: runtime.db.call(check),
            Backoff(runtime.db.answers),
            tries=GATE_TRIES,
            what=f"checking the gates of job {job.id}",
            sleep=asyncio.sleep,
        )
    except DatabaseUnavailable as error:
        raise Snooze(_jittered(OUTAGE_DELAY_SECONDS), reason=f"gates unchecked: {error}") from None
    if not verdict.allowed:
        delay, reason = _deferral(verdict, task, breaker_key, rate)
        log.debug("job %d (%s) deferred %.2f s: %s", job.id, job.job_type, delay, reason)
        raise Snooze(delay, reason=reason)
    if breaker is None or breaker_key is None:
        return None
    if verdict.probe:
        log.info("circuit breaker %r is half-open: job %d is its probe", breaker_key, job.id)
    return Admission(job=job, task=task, breaker=breaker, key=breaker_key, probe=verdict.probe)


def _key(kind: str, key: GateKey | None, payload: dict[str, Any], task: Task) -> str:
    """The job's key for its ``kind`` of gate; a keyed hash of it when it reads a secret
    field (see sqlqueue/_secret_keys.py): the gate's row must not name the secret."""
    try:
        value = resolve_key(f"{kind}.key", key, payload, task.name)
    except Exception as error:
        raise BadGateKey(
            f"the {kind} key of task {task.name!r} failed for this payload: "
            f"{type(error).__name__}: {error}"
        ) from error
    if (
        task.secrets is not None
        and callable(key)
        and reads_a_secret(task.secrets, key, payload, value)
    ):
        return keyed_key(task.secrets, value)
    return value


def _deferral(
    verdict: Verdict, task: Task, breaker_key: str | None, rate: RateCheck | None
) -> tuple[float, str]:
    """How long a refused attempt waits, and why.

    Never less than the database says; a little jitter on top keeps the jobs of one key from
    all coming back in the same instant. When a probe is in flight nobody knows when it ends,
    so the others look again after a tenth of the cool-down (1 s at least, never more than the
    cool-down itself).
    """
    if verdict.refused_by == "rate_limit" and rate is not None:
        interval = 1.0 / rate.per_second
        wait = verdict.wait or 0.0
        return wait + random.uniform(0.0, min(interval, 1.0)), f"rate limit {rate.key!r}"
    breaker = task.circuit_breaker
    assert breaker is not None
    if verdict.wait is not None:
        spread = min(1.0, breaker.cooldown_seconds / 10)
        return verdict.wait + random.uniform(0.0, spread), f"circuit breaker {breaker_key!r} open"
    cooldown = breaker.cooldown_seconds
    recheck = min(cooldown, max(1.0, cooldown / 10))
    return _jittered(recheck), f"circuit breaker {breaker_key!r} half-open, its probe in flight"


def _jittered(seconds: float) -> float:
    return seconds * random.uniform(1.0, 1.5)


async def report(
    admission: Admission | None, runtime: Runtime, error: BaseException | None
) -> None:
    """Tell the breaker what the admitted attempt did: success, a failure that counts (see
    :func:`counts_as_failure`), or neither — which hands a probe back for another attempt."""
    if admission is None:
        return
    store = runtime.store
    key, fence, probe = admission.key, admission.job.fence, admission.probe
    breaker = admission.breaker
    operation: Callable[[], str | None]
    if error is None:
        operation = partial(store.record_success, key=key, fence=fence, probe=probe)
    elif counts_as_failure(error, retryable=admission.task.retryable(error)):
        operation = partial(
            store.record_failure,
            key=key,
            fence=fence,
            probe=probe,
            failure_threshold=breaker.failure_threshold,
            window_seconds=breaker.window_seconds,
            cooldown_seconds=breaker.cooldown_seconds,
        )
    elif probe:
        operation = partial(store.record_neutral, key=key, fence=fence)
    else:
        return
    try:
        changed = await retry_quickly(
            lambda: runtime.db.call(operation),
            Backoff(runtime.db.answers),
            tries=GATE_TRIES,
            what=f"recording job {admission.job.id}'s outcome on circuit breaker {key!r}",
            sleep=asyncio.sleep,
        )
    except DatabaseError as failure:
        log.warning(
            "could not record job %d's outcome on circuit breaker %r: %s",
            admission.job.id,
            key,
            failure,
        )
        return
    if changed == "open":
        log.warning(
            "circuit breaker %r %s: its jobs are deferred for %g s, then one probe goes through",
            key,
            "re-opened: the probe failed" if probe else "opened",
            breaker.cooldown_seconds,
        )
    elif changed == "closed":
        log.info("circuit breaker %r closed: the probe (job %d) succeeded", key, fence[0])
