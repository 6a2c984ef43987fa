"""Circuit breakers per key: state in the database, shared by every worker process.

The state machine is walked with an injected clock (closed → open → half-open → closed or open
again); the single probe is raced by threads and by real worker processes; and while one key is
open, another key's jobs keep flowing at full speed.
"""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import sqlqueue
from sqlqueue._policies.circuit_breaker import counts_as_failure
from sqlqueue._store.gates import BreakerCheck, RateCheck, Verdict
from sqlqueue._store.rows import ClaimedJob
from sqlqueue._store.store import Store
from tests._support import WorkerThread, wait_until
from tests.apps.gates import (
    BREAKER_COOLDOWN,
    BREAKER_THRESHOLD,
    create_gate_ledger,
    read_gate_ledger,
    register_gate_tasks,
)
from tests.apps.processes import Workers
from tests.apps.processes import wait_until as wait_for
from tests.conftest import Backend

pytestmark = pytest.mark.timeout(120)

T0 = datetime(2030, 1, 1, tzinfo=UTC)
KEY = "endpoint:a"


def at(seconds: float) -> datetime:
    """``seconds`` after T0 on the injected clock."""
    return T0 + timedelta(seconds=seconds)


class Harness:
    """The breaker's store operations on one backend, with running jobs to act as attempts."""

    def __init__(self, backend: Backend) -> None:
        self.queue = backend.queue()
        self.queue.task("call")(lambda: None)
        self.gates = Store(self.queue.engine, self.queue.dialect)

    def running(self, n: int) -> list[ClaimedJob]:
        """``n`` jobs claimed by a worker: live attempts whose fences can hold the probe."""
        with self.queue.engine.begin() as conn:
            ids = self.queue.enqueue_many(
                conn, [sqlqueue.JobRequest(job_type="call") for _ in range(n)]
            )
        claimed = self.queue.store.claim(
            queues=["default"], job_types=None, limit=n, worker_id="w", lease_seconds=600
        )
        assert sorted(job.id for job in claimed) == sorted(ids)
        return sorted(claimed, key=lambda job: job.id)

    def enter(self, job: ClaimedJob, seconds: float, key: str = KEY) -> Verdict:
        return self.gates.pass_gates(
            fence=job.fence, breaker=BreakerCheck(key=key), rate=None, now=at(seconds)
        )

    def fail(self, job: ClaimedJob, seconds: float, *, probe: bool = False) -> str | None:
        return self.gates.record_failure(
            key=KEY,
            fence=job.fence,
            probe=probe,
            failure_threshold=3,
            window_seconds=10.0,
            cooldown_seconds=30.0,
            now=at(seconds),
        )

    def succeed(self, job: ClaimedJob, seconds: float, *, probe: bool = False) -> str | None:
        return self.gates.record_success(key=KEY, fence=job.fence, probe=probe, now=at(seconds))

    def state(self, key: str = KEY) -> str | None:
        stored = self.gates.read_breaker(key)
        return stored.state if stored is not None else None

    def open_breaker(self, job: ClaimedJob, seconds: float) -> None:
        """Three failures in a row at ``seconds``: the breaker opens until ``seconds + 30``."""
        assert [self.fail(job, seconds) for _ in range(3)] == [None, None, "open"]


# -- configuration and what counts ------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"failure_threshold": 0}, "failure_threshold"),
        ({"failure_threshold": 2.5}, "failure_threshold"),
        ({"failure_threshold": True}, "failure_threshold"),
        ({"window_seconds": 0}, "window_seconds"),
        ({"window_seconds": float("inf")}, "window_seconds"),
        ({"cooldown_seconds": -1}, "cooldown_seconds"),
        ({"cooldown_seconds": "30"}, "cooldown_seconds"),
        ({"key": ""}, "key"),
        ({"key": b"bytes"}, "key"),
    ],
)
def test_a_bad_breaker_is_refused_at_construction_naming_the_field(options, field):
    with pytest.raises(sqlqueue.ConfigurationError, match=rf"CircuitBreaker\.{field}"):
        sqlqueue.CircuitBreaker(**options)


def test_a_breaker_is_a_frozen_keyword_only_value_with_documented_defaults():
    breaker = sqlqueue.CircuitBreaker()
    assert (breaker.failure_threshold, breaker.window_seconds, breaker.cooldown_seconds) == (
        5,
        60.0,
        30.0,
    )
    with pytest.raises(TypeError):
        sqlqueue.CircuitBreaker(5)  # type: ignore[call-arg]
    with pytest.raises(AttributeError):
        breaker.failure_threshold = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    ("error", "retryable", "counts"),
    [
        (ConnectionError("refused"), True, True),
        (ConnectionError("refused"), False, False),  # outside the task's retry_on
        (sqlqueue.Retry(delay=5), True, True),
        (sqlqueue.JobTimeout("too slow"), True, True),
        (sqlqueue.PermanentError("400 Bad Request"), False, False),
        (sqlqueue.Snooze(10), True, False),
    ],
)
def test_what_counts_as_a_failure(error, retryable, counts):
    assert counts_as_failure(error, retryable=retryable) is counts


# -- the state machine, with an injected clock ------------------------------------------------


def test_consecutive_failures_within_the_window_open_the_breaker(backend):
    h = Harness(backend)
    (job,) = h.running(1)
    assert h.enter(job, 0).allowed  # never used: closed, and nothing written
    assert h.state() is None

    assert [h.fail(job, 0), h.fail(job, 1)] == [None, None]
    assert h.succeed(job, 2) is None  # a success ends the streak …
    assert h.gates.read_breaker(KEY).failures == 0  # type: ignore[union-attr]
    assert [h.fail(job, 3), h.fail(job, 4)] == [None, None]
    assert h.fail(job, 20) is None  # … and so does a streak whose first failure left the window
    stored = h.gates.read_breaker(KEY)
    assert stored is not None
    assert (stored.state, stored.failures, stored.streak_started_at) == ("closed", 1, at(20))

    assert [h.fail(job, 21), h.fail(job, 22)] == [None, "open"]
    stored = h.gates.read_breaker(KEY)
    assert stored is not None
    assert (stored.state, stored.open_until) == ("open", at(52))


def test_an_open_breaker_defers_until_the_cooldown_then_lets_one_probe_through(backend):
    h = Harness(backend)
    first, second, third = h.running(3)
    h.open_breaker(first, 0)

    refused = h.enter(second, 10)
    assert (refused.allowed, refused.refused_by, refused.wait) == (False, "breaker", 20.0)
    # An attempt that passed before the breaker opened does not speak for the key now.
    assert h.succeed(first, 11) is None
    assert h.state() == "open"

    probe = h.enter(second, 30)
    assert (probe.allowed, probe.probe) == (True, True)
    assert h.state() == "half_open"
    busy = h.enter(third, 30.5)
    assert (busy.allowed, busy.wait) == (False, None)  # the probe is in flight: wait and see
    assert h.fail(first, 31) is None  # not the probe's result: ignored
    assert h.state() == "half_open"

    assert h.fail(second, 32, probe=True) == "open"  # the probe failed: another cool-down
    stored = h.gates.read_breaker(KEY)
    assert stored is not None
    assert (stored.state, stored.open_until, stored.probe_job_id) == ("open", at(62), None)
    assert h.enter(third, 61.9).wait == pytest.approx(0.1)

    probe = h.enter(third, 62)
    assert probe.probe
    assert h.succeed(third, 63, probe=True) == "closed"
    stored = h.gates.read_breaker(KEY)
    assert stored is not None
    assert (stored.state, stored.failures, stored.open_until) == ("closed", 0, None)
    after = h.enter(first, 64)
    assert (after.allowed, after.probe) == (True, False)


def test_a_probe_that_says_nothing_or_whose_worker_died_is_handed_on(backend):
    h = Harness(backend)
    first, second, third = h.running(3)
    h.open_breaker(first, 0)

    assert h.enter(first, 30).probe
    # A snooze or a permanent error says nothing about the key: the probe is handed back.
    h.gates.record_neutral(key=KEY, fence=first.fence, now=at(31))
    assert h.state() == "half_open"
    assert h.enter(second, 31).probe

    # The probe's worker stops (here: gives its job back); its job no longer runs under that
    # attempt, so the probe is free for the next attempt at once.
    assert not h.enter(third, 32).allowed
    assert h.queue.store.release(worker_id="w", fences=[second.fence]) == {second.id}
    assert h.enter(third, 33).probe
    assert h.succeed(second, 34, probe=True) is None  # the old holder's result is stale
    assert h.state() == "half_open"


def test_racing_attempts_take_exactly_one_probe(backend):
    h = Harness(backend)
    jobs = h.running(12)
    h.open_breaker(jobs[0], 0)
    verdicts: list[Verdict] = []
    lock = threading.Lock()
    start = threading.Barrier(len(jobs))

    def attempt(job: ClaimedJob) -> None:
        start.wait()
        verdict = h.enter(job, 30)
        with lock:
            verdicts.append(verdict)

    threads = [threading.Thread(target=attempt, args=(job,)) for job in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(verdicts) == len(jobs)
    assert sum(v.probe for v in verdicts) == 1
    assert sum(v.allowed for v in verdicts) == 1


def test_a_probe_refused_by_the_rate_limit_is_not_held_and_no_token_goes_to_an_open_key(
    backend,
):
    h = Harness(backend)
    first, second = h.running(2)
    h.open_breaker(first, 0)
    limit = RateCheck(key="provider", per_second=1.0, capacity=1.0)

    # Open: refused by the breaker before the bucket is touched.
    refused = h.gates.pass_gates(
        fence=second.fence, breaker=BreakerCheck(key=KEY), rate=limit, now=at(10)
    )
    assert refused.refused_by == "breaker"
    assert h.gates.read_bucket("provider") is None

    # Past the cool-down the probe is free, but the bucket is empty: all or nothing.
    assert h.gates.pass_gates(fence=first.fence, breaker=None, rate=limit, now=at(30)).allowed
    refused = h.gates.pass_gates(
        fence=second.fence, breaker=BreakerCheck(key=KEY), rate=limit, now=at(30.5)
    )
    assert refused.refused_by == "rate_limit"
    assert refused.wait == pytest.approx(0.5)
    stored = h.gates.read_breaker(KEY)
    assert stored is not None
    assert (stored.state, stored.probe_job_id) == ("open", None)

    passed = h.gates.pass_gates(
        fence=second.fence, breaker=BreakerCheck(key=KEY), rate=limit, now=at(31)
    )
    assert (passed.allowed, passed.probe) == (True, True)


# -- in a worker -------------------------------------------------------------------------------


def test_only_failures_of_the_dependency_open_the_breaker_and_deferrals_burn_no_attempt(backend):
    queue = backend.queue()
    calls: list[tuple[str, str]] = []
    breaker = sqlqueue.CircuitBreaker(
        failure_threshold=2, cooldown_seconds=60, key=lambda payload: payload["endpoint"]
    )

    @queue.task("hook", timeout=0.3, backoff=sqlqueue.schedule([60]), circuit_breaker=breaker)
    async def hook(endpoint: str, mode: str) -> None:
        calls.append((endpoint, mode))
        if mode == "bad_input":
            raise sqlqueue.PermanentError("400 Bad Request")
        if mode == "not_yet":
            raise sqlqueue.Snooze(60)
        if mode == "hang":
            await asyncio.sleep(10)

    gates = Store(queue.engine, queue.dialect)

    def enqueue(endpoint: str, mode: str, n: int = 1) -> list[int]:
        with backend.engine.begin() as conn:
            ids: list[int] = hook.enqueue_many(conn, [{"endpoint": endpoint, "mode": mode}] * n)
        return ids

    def settled(ids: list[int], status: str) -> bool:
        return all(queue.get_job(i).status == status for i in ids)

    def state(key: str) -> str | None:
        stored = gates.read_breaker(key)
        return stored.state if stored is not None else None

    def snoozed_long(job_id: int) -> bool:
        job = queue.get_job(job_id)
        later = job.created_at + timedelta(seconds=30)
        return bool(job.status == "queued" and job.next_run_at > later)

    with WorkerThread(queue.worker(concurrency=4, poll_interval=0.02)):
        permanent = enqueue("a", "bad_input", 3)
        snoozed = enqueue("a", "not_yet", 3)
        wait_until(lambda: settled(permanent, "dead") and len(calls) == 6)
        assert gates.read_breaker("a") is None  # neither counted

        timeouts = enqueue("a", "hang", 2)  # JobTimeout counts: two in a row open "a"
        wait_until(lambda: settled(timeouts, "failed"))
        wait_until(lambda: state("a") == "open")

        calls.clear()
        deferred = enqueue("a", "ok", 4)
        flowing = enqueue("b", "ok", 20)
        wait_until(lambda: settled(flowing, "succeeded"), timeout=10)
        wait_until(lambda: all(snoozed_long(i) for i in deferred))

    assert calls == [("b", "ok")] * 20, "no call reached the open endpoint"
    for job_id in deferred:
        job = queue.get_job(job_id)
        assert (job.status, job.attempts, job.errors) == ("queued", 0, ())
    assert {queue.get_job(i).attempts for i in flowing} == {1}
    assert {queue.get_job(i).status for i in snoozed} == {"queued"}


# -- worker processes: one probe, and the other key flows -------------------------------------


PROBE_SECONDS = 0.8
WAITING_JOBS = 12
OTHER_JOBS = 24


def test_worker_processes_share_a_breaker_send_one_probe_and_let_other_keys_flow(
    backend: Backend, workers: Workers, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    create_gate_ledger(backend.engine)
    queue = backend.queue()
    register_gate_tasks(queue)
    gates = Store(queue.engine, queue.dialect)
    pool = [
        workers.start(
            "--concurrency", "4", "--poll-interval", "0.05", app="tests.apps.gates_app:queue"
        )
        for _ in range(3)
    ]
    for worker in pool:
        worker.wait_ready()
    explain = lambda: "\n".join(w.describe() for w in pool)  # noqa: E731

    def enqueue(endpoint: str, n: int, **payload: object) -> list[int]:
        requests = [
            sqlqueue.JobRequest(
                job_type="gates.call",
                payload={"key": f"{endpoint}:{i}", "endpoint": endpoint, **payload},
                max_attempts=1 if payload.get("fail") else 8,
            )
            for i in range(n)
        ]
        with backend.engine.begin() as conn:
            return queue.enqueue_many(conn, requests)

    def all_in(ids: list[int], status: str) -> bool:
        return all(queue.get_job(i).status == status for i in ids)  # type: ignore[union-attr]

    # The endpoint fails twice in a row: the breaker opens for every worker.
    failing = enqueue("down", BREAKER_THRESHOLD, fail=True)
    wait_for(lambda: all_in(failing, "dead"), timeout=20, what="the failures", explain=explain)
    opened = gates.read_breaker("endpoint:down")
    assert opened is not None
    assert opened.state == "open"

    # It recovers (each call now takes PROBE_SECONDS and succeeds), but answers only once the
    # test opens its gate, so its breaker cannot close before then however slow the machine
    # is; meanwhile another endpoint gets work.
    answers = tmp_path / "down-answers"
    waiting = enqueue("down", WAITING_JOBS, seconds=PROBE_SECONDS, gate=str(answers))
    flowing = enqueue("up", OTHER_JOBS, seconds=0.05)
    wait_for(lambda: all_in(flowing, "succeeded"), timeout=30, what="'up'", explain=explain)
    still = gates.read_breaker("endpoint:down")
    assert still is not None
    # Open, or half-open once the cool-down is over: the single probe may have started, and
    # it cannot have answered.
    assert still.state in ("open", "half_open"), "the other key finished while this one was shut"
    ledger = read_gate_ledger(backend.engine)
    calls = [row for row in ledger if row.endpoint == "down"][BREAKER_THRESHOLD:]
    assert len(calls) <= 1, "at most the single probe reached the shut endpoint"
    assert all(row.finished is None for row in calls)
    up = [row for row in ledger if row.endpoint == "up"]
    up_seconds = max(row.finished for row in up) - min(row.started for row in up)
    answers.touch()

    wait_for(lambda: all_in(waiting, "succeeded"), timeout=30, what="'down'", explain=explain)
    for worker in pool:
        assert worker.stop() == 0, worker.describe()

    closed = gates.read_breaker("endpoint:down")
    assert closed is not None
    assert closed.state == "closed"
    attempts = {job.attempts for job in map(queue.get_job, waiting) if job is not None}
    assert attempts == {1}, "deferrals burn no attempt"
    ledger = read_gate_ledger(backend.engine)
    failures = [row for row in ledger if row.endpoint == "down"][:BREAKER_THRESHOLD]
    recovered = [row for row in ledger if row.endpoint == "down"][BREAKER_THRESHOLD:]
    assert len(recovered) == WAITING_JOBS
    probe, rest = recovered[0], recovered[1:]
    # Nothing reached the endpoint during the cool-down; then exactly one probe, alone until it
    # finished, though several workers held jobs for the key.
    assert probe.started >= failures[-1].finished + BREAKER_COOLDOWN - 0.2
    assert all(row.started >= probe.finished for row in rest), [
        round(row.started - probe.started, 3) for row in rest
    ]
    assert len({row.pid for row in recovered}) > 1
    probe_after = probe.started - failures[-1].finished
    rest_after = min(row.started for row in rest) - probe.finished
    with capsys.disabled():
        print(
            f"\n    [{backend.name}] breaker open: {OTHER_JOBS} jobs of another key ran in "
            f"{up_seconds:.2f} s; the probe started {probe_after:.2f} s after the last failure "
            f"(cool-down {BREAKER_COOLDOWN:g} s), the others {rest_after:.2f} s after it succeeded"
        )
