"""Prometheus metrics: a real worker process started with ``--metrics-port`` is scraped over
HTTP, and its counters, histograms and queue gauges are checked against the jobs it ran and
against ``queue.stats()``; an in-process worker covers the snoozed and cancelled outcomes.
Without ``metrics_port`` the worker never imports ``prometheus_client``."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

import sqlqueue
from tests._support import WorkerThread, db_now, port_in
from tests.apps.observe_app import queue as observe_queue
from tests.apps.processes import REPO_ROOT, Workers, wait_until
from tests.conftest import Backend

pytestmark = pytest.mark.timeout(120)

#: (name, labels) -> value of every sample of one scrape.
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(port: int) -> Samples:
    """GET /metrics and parse it with prometheus_client's own parser."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    """One sample's value (0 when the series does not exist yet)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def total(samples: Samples, name: str) -> float:
    """The sum of every series of ``name``."""
    return sum(v for (n, _), v in samples.items() if n == name)


@pytest.fixture
def workers(backend: Backend, tmp_path: Path) -> Iterator[Workers]:
    started = Workers(backend.url, tmp_path)
    try:
        yield started
    finally:
        started.close()


def test_a_worker_process_serves_counts_histograms_and_gauges(
    backend: Backend, workers: Workers
) -> None:
    queue = observe_queue.rebind(backend.engine)
    long_due = db_now(backend.engine) - timedelta(seconds=120)
    with backend.engine.begin() as conn:
        for n in range(5):
            queue.enqueue(conn, "succeed", {"n": n})
        queue.enqueue(conn, "succeed", {"n": 99}, run_at=long_due)  # waited 120 s when started
        for _ in range(3):
            queue.enqueue(conn, "flaky")
        for _ in range(2):
            queue.enqueue(conn, "doomed")
        queue.enqueue(conn, "parked")  # on a queue the worker does not serve
    # Port 0: the worker binds a port the kernel chose and logs which.
    worker = workers.start(
        "--queues", "default", "--poll-interval", "0.05",
        "--metrics-port", "0", "--metrics-interval", "0.2",
        app="tests.apps.observe_app:queue",
    )  # fmt: skip
    port = wait_until(
        lambda: port_in(worker.log(), r"serving Prometheus metrics on port (\d+)"),
        timeout=30,
        what="the metrics endpoint",
        explain=worker.describe,
    )

    # 6 successes, 3 flaky jobs failing once and then succeeding, 2 doomed failing then dead.
    wait_until(
        lambda: total(scrape(port), "sqlqueue_jobs_total") == 16,
        timeout=60,
        what="16 outcomes in sqlqueue_jobs_total",
        explain=lambda: f"{scrape(port)}\n{worker.describe()}",
    )

    # Within a --metrics-interval the gauges read the stats again: all 9 successes and both
    # dead jobs show (a read taken before the last outcome could still count one as failed).
    def settled() -> Samples | None:
        found = scrape(port)
        succeeded = value(found, "sqlqueue_queue_jobs", queue="default", status="succeeded")
        dead = value(found, "sqlqueue_queue_jobs", queue="default", status="dead")
        failed = value(found, "sqlqueue_queue_jobs", queue="default", status="failed")
        return found if (succeeded, dead, failed) == (9, 2, 0) else None

    samples = wait_until(
        settled, timeout=30, what="the queue gauges to show 9 successes and 2 dead jobs"
    )
    stats = queue.stats()
    worker.stop()

    jobs = {
        (job_type, outcome): value(
            samples, "sqlqueue_jobs_total", queue="default", job_type=job_type, outcome=outcome
        )
        for job_type in ("succeed", "flaky", "doomed")
        for outcome in ("succeeded", "failed", "dead", "snoozed", "cancelled")
    }
    assert {key: count for key, count in jobs.items() if count} == {
        ("succeed", "succeeded"): 6,
        ("flaky", "failed"): 3,
        ("flaky", "succeeded"): 3,
        ("doomed", "failed"): 2,
        ("doomed", "dead"): 2,
    }
    for job_type, attempts in (("succeed", 6), ("flaky", 6), ("doomed", 4)):
        labels = {"queue": "default", "job_type": job_type}
        assert value(samples, "sqlqueue_job_duration_seconds_count", **labels) == attempts
        assert value(samples, "sqlqueue_job_duration_seconds_bucket", le="+Inf", **labels) == (
            attempts
        )
        assert value(samples, "sqlqueue_job_duration_seconds_sum", **labels) >= 0
    assert value(samples, "sqlqueue_job_wait_seconds_count", queue="default") == 16
    # The built-in metrics middleware saw every handler call begin and end.
    for job_type, calls in (("succeed", 6), ("flaky", 6), ("doomed", 4)):
        labels = {"queue": "default", "job_type": job_type}
        assert value(samples, "sqlqueue_attempts_started_total", **labels) == calls
        assert value(samples, "sqlqueue_attempts_in_progress", **labels) == 0
        assert value(samples, "sqlqueue_handler_duration_seconds_count", **labels) == calls
    # Only the job due 120 s before it was enqueued waited more than a minute.
    assert value(samples, "sqlqueue_job_wait_seconds_bucket", queue="default", le="60.0") == 15
    assert value(samples, "sqlqueue_job_wait_seconds_sum", queue="default") >= 120

    assert set(stats.queues) == {"default", "parked"}
    for name, queue_stats in stats.queues.items():
        for status, count in queue_stats.by_status.items():
            assert value(samples, "sqlqueue_queue_jobs", queue=name, status=status) == count
    assert value(samples, "sqlqueue_queue_jobs", queue="default", status="succeeded") == 9
    assert value(samples, "sqlqueue_queue_jobs", queue="parked", status="queued") == 1
    parked_age = stats.queues["parked"].oldest_queued_age_seconds
    assert parked_age is not None
    assert value(samples, "sqlqueue_queue_oldest_age_seconds", queue="parked") == pytest.approx(
        parked_age, abs=5
    )
    assert value(samples, "sqlqueue_queue_oldest_age_seconds", queue="default") == 0


def test_the_queue_gauges_read_the_stats_once_per_interval(backend: Backend) -> None:
    queue = observe_queue.rebind(backend.engine)
    worker = queue.worker(
        queues=["default"], metrics_port=0, metrics_interval=60.0, poll_interval=0.05
    )
    with WorkerThread(worker):
        wait_until(lambda: worker.metrics_port is not None, timeout=30, what="metrics served")
        assert worker.metrics_port is not None
        first = scrape(worker.metrics_port)
        with backend.engine.begin() as conn:
            queue.enqueue(conn, "parked")
        second = scrape(worker.metrics_port)
    # Both scrapes inside one interval: the second saw the first's read, not the new job.
    assert value(first, "sqlqueue_queue_jobs", queue="parked", status="queued") == 0
    assert value(second, "sqlqueue_queue_jobs", queue="parked", status="queued") == 0
    assert queue.stats().queues["parked"].by_status["queued"] == 1


def test_waiting_workflow_steps_are_a_queue_gauge(backend: Backend) -> None:
    queue = backend.queue()
    queue.task("step")(lambda: None)
    wf = sqlqueue.Workflow()
    wf.add("first", sqlqueue.JobRequest(job_type="step"))
    for name in ("second", "third"):
        wf.add(name, sqlqueue.JobRequest(job_type="step"), after=["first"])
    queue.enqueue_workflow(backend.engine, wf)
    worker = queue.worker(queues=["elsewhere"], metrics_port=0, poll_interval=0.05)
    with WorkerThread(worker):
        wait_until(lambda: worker.metrics_port is not None, timeout=30, what="metrics served")
        assert worker.metrics_port is not None
        samples = scrape(worker.metrics_port)
    assert value(samples, "sqlqueue_queue_jobs", queue="default", status="waiting") == 2
    assert value(samples, "sqlqueue_queue_jobs", queue="default", status="queued") == 1


def test_snoozed_and_cancelled_attempts_are_counted(backend: Backend) -> None:
    queue = backend.queue(lease_seconds=1.5)  # a heartbeat (and a cancel check) every 0.5 s
    snoozed: list[int] = []

    @queue.task("snoozer")
    def snoozer(ctx: sqlqueue.JobContext) -> None:
        if ctx.job_id not in snoozed:
            snoozed.append(ctx.job_id)
            raise sqlqueue.Snooze(0.0)

    @queue.task("waits_for_cancel", max_attempts=5)
    def waits_for_cancel(ctx: sqlqueue.JobContext) -> None:
        deadline = time.monotonic() + 30
        while not ctx.cancelled and time.monotonic() < deadline:
            time.sleep(0.01)
        raise RuntimeError("stopped: cancelled")

    with backend.engine.begin() as conn:
        queue.enqueue(conn, "snoozer")
        cancelled_id = queue.enqueue(conn, "waits_for_cancel")
    worker = queue.worker(metrics_port=0, poll_interval=0.05)
    with WorkerThread(worker):
        wait_until(
            lambda: (job := queue.get_job(cancelled_id)) is not None and job.status == "running",
            timeout=30,
            what="the job to run",
        )
        queue.cancel(cancelled_id)
        wait_until(
            lambda: (job := queue.get_job(cancelled_id)) is not None and job.status == "cancelled",
            timeout=30,
            what="the job to end cancelled",
        )
        assert worker.metrics_port is not None
        port = worker.metrics_port
        wait_until(
            lambda: total(scrape(port), "sqlqueue_jobs_total") == 3, timeout=30, what="3 outcomes"
        )
        samples = scrape(port)
    counts = {
        (dict(labels)["job_type"], dict(labels)["outcome"]): count
        for (name, labels), count in samples.items()
        if name == "sqlqueue_jobs_total"
    }
    assert counts == {
        ("snoozer", "snoozed"): 1,
        ("snoozer", "succeeded"): 1,
        ("waits_for_cancel", "cancelled"): 1,
    }


def test_a_worker_made_directly_takes_a_metrics_port(backend: Backend) -> None:
    queue = backend.queue()
    queue.task("noop")(lambda: None)
    worker = sqlqueue.Worker(queue, metrics_port=0)
    assert worker.settings.metrics_port == 0
    worker.run(burst=True)  # serves, finds nothing due, stops serving
    assert worker.metrics_port is None


def test_a_taken_port_is_a_configuration_error(backend: Backend) -> None:
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        queue = backend.queue()
        queue.task("noop")(lambda: None)
        worker = queue.worker(metrics_port=taken.getsockname()[1])
        with pytest.raises(sqlqueue.ConfigurationError, match="cannot serve metrics on port"):
            worker.run(burst=True)


@pytest.mark.parametrize("port", [-1, 65536, True, "9108"])
def test_a_bad_metrics_port_is_refused(port: object, tmp_path: Path) -> None:
    queue = sqlqueue.Queue(f"sqlite:///{tmp_path / 'unopened.db'}")
    with pytest.raises(sqlqueue.ConfigurationError, match="metrics_port"):
        queue.worker(metrics_port=port)  # type: ignore[arg-type]


def test_without_metrics_port_prometheus_client_is_never_imported(tmp_path: Path) -> None:
    """A worker without metrics runs jobs and never loads prometheus_client."""
    script = f"""
import sys
import sqlqueue

queue = sqlqueue.Queue("sqlite:///{tmp_path / "q.db"}")
sqlqueue.migrate(queue.engine)

@queue.task("noop")
def noop() -> None:
    pass

with queue.engine.begin() as conn:
    queue.enqueue(conn, "noop")
queue.worker().run(burst=True)
assert queue.stats().by_status["succeeded"] == 1
assert "prometheus_client" not in sys.modules, "prometheus_client was imported"
"""
    subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, check=True, timeout=60)
