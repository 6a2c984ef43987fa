"""``python -m bench.observe``: what metrics and tracing cost a worker, on a drain of no-op jobs.

The same drain as ``python -m bench --only drain`` (a backlog released at once to one burst
worker; jobs/s over the drain window on the database clock) with the worker's observability
set up five ways, all measured in the same run, in an order that rotates between runs:

- ``none``: OpenTelemetry hidden (not importable), no metrics: the baseline;
- ``otel, unconfigured``: OpenTelemetry installed, no SDK (the API's no-op provider);
- ``metrics``: ``--metrics-port 0`` (Prometheus), OpenTelemetry hidden;
- ``tracing``: an SDK ``TracerProvider`` with a ``BatchSpanProcessor`` to an exporter that
  drops every span (see bench/observe_worker.py);
- ``metrics + tracing``: both.

Every backlog is enqueued inside a traced request, so each job carries a trace context that
the tracing worker continues. Each row prints the median jobs/s (min-max), its ratio to
``none`` (per run, then the median), and the worker's CPU per job, the steadier figure on a
busy machine (user + system of the worker process from the release to its exit).

Then the producer side, in this process: ``--enqueue-jobs`` jobs, one ``queue.enqueue`` per
transaction, with no tracing (the queue's ``tracing`` removed, as without OpenTelemetry), with
OpenTelemetry unconfigured (a ``NoOpTracerProvider``), and with an SDK provider batching to a
sink; jobs/s and this process's CPU per enqueue (on SQLite that includes the database's work).

    python -m bench.observe                        # 5,000 jobs, 3 runs, SQLite and PostgreSQL
    python -m bench.observe --jobs 500 --runs 1 --backends sqlite   # a smoke run
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import NoOpTracerProvider

import sqlqueue
from bench import drain
from bench.databases import DEFAULT_POSTGRES_URL, Target, fresh_database
from bench.names import APP, NOOP, NOOP_ASYNC
from bench.settings import Settings

__all__ = ["MODES", "main", "worker_command"]

#: label -> (bench/observe_worker.py mode, Prometheus metrics on)
MODES: dict[str, tuple[str, bool]] = {
    "none": ("no-otel", False),
    "otel, unconfigured": ("otel", False),
    "metrics": ("no-otel", True),
    "tracing": ("tracing", False),
    "metrics + tracing": ("tracing", True),
}


def worker_command(
    mode: str, *, metrics: bool, concurrency: int, poll_interval: float
) -> list[str]:
    """One burst worker of ``bench.app`` through the launcher, set up as ``mode`` says."""
    command = [sys.executable, "-m", "bench.observe_worker", mode, "--log-level", "INFO"]
    command += ["worker", APP, "--concurrency", str(concurrency)]
    command += ["--poll-interval", repr(poll_interval), "--burst"]
    return [*command, "--metrics-port", "0"] if metrics else command


class _Drop(SpanExporter):
    """Accepts every batch of spans and keeps nothing."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def _batching_provider() -> TracerProvider:
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(_Drop()))
    return provider


#: label -> the Queue of an enqueue measurement on a URL.
ENQUEUE_MODES: dict[str, Callable[[str], sqlqueue.Queue]] = {
    "none": lambda url: _untraced(sqlqueue.Queue(url)),
    "otel, unconfigured": lambda url: sqlqueue.Queue(url, tracer_provider=NoOpTracerProvider()),
    "tracing": lambda url: sqlqueue.Queue(url, tracer_provider=_batching_provider()),
}


def _untraced(queue: sqlqueue.Queue) -> sqlqueue.Queue:
    queue.tracing = None  # what a Queue is without OpenTelemetry installed
    return queue


def enqueue_one_by_one(queue: sqlqueue.Queue, jobs: int) -> tuple[float, float]:
    """``jobs`` enqueues, one per transaction, after 20 warm-up ones: (jobs/s, CPU µs/job)."""
    try:
        for n in range(20):
            with queue.engine.begin() as conn:
                queue.enqueue(conn, NOOP, {"n": n}, external=True)
        wall, cpu = time.perf_counter(), time.process_time()
        for n in range(jobs):
            with queue.engine.begin() as conn:
                queue.enqueue(conn, NOOP, {"n": n}, external=True)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    finally:
        queue.engine.dispose()
        if queue.tracing is not None and queue.tracing.tracer_provider is not None:
            shutdown = getattr(queue.tracing.tracer_provider, "shutdown", None)
            if shutdown is not None:
                shutdown()
    return jobs / wall, cpu * 1e6 / jobs


def _series(values: Sequence[float]) -> str:
    return f"{statistics.median(values):8.1f} ({min(values):.1f}-{max(values):.1f})"


def main(argv: Sequence[str] | None = None) -> int:
    """Measure every mode ``--runs`` times per backend and print one table per backend."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.observe",
        description=(__doc__ or "").split("\n\n", 1)[0],
        epilog=(__doc__ or "").split("\n\n", 1)[-1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--jobs", type=int, default=5_000, help="jobs per drain (5,000)")
    parser.add_argument("--runs", type=int, default=3, help="runs per mode (3)")
    parser.add_argument("--backends", default="sqlite,postgresql", help="sqlite,postgresql")
    parser.add_argument("--concurrency", type=int, default=10, help="worker slots (10)")
    parser.add_argument(
        "--handler", choices=("sync", "async"), default="sync", help="the no-op's kind (sync)"
    )
    parser.add_argument("--postgres-url", default=DEFAULT_POSTGRES_URL)
    parser.add_argument("--sqlite-dir", type=Path)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per drain (600)")
    parser.add_argument(
        "--enqueue-jobs", type=int, default=2_000, help="one-job enqueues per run (2,000)"
    )
    args = parser.parse_args(argv)
    backends = tuple(name.strip() for name in args.backends.split(",") if name.strip())
    settings = Settings(
        backends=backends,
        runs=args.runs,
        target=Target(postgres_url=args.postgres_url, sqlite_dir=args.sqlite_dir),
        timeout=args.timeout,
    )
    # The backlog's enqueue runs in a span, so every job carries a trace context.
    enqueuer = TracerProvider()
    request = enqueuer.get_tracer("bench.observe")
    job_type = NOOP if args.handler == "sync" else NOOP_ASYNC
    labels = list(MODES)
    print(
        f"{args.jobs} no-op jobs ({args.handler}), 1 worker process x concurrency "
        f"{args.concurrency}, {args.runs} runs",
        flush=True,
    )
    for backend in backends:
        drains: dict[str, tuple[list[float], list[float]]] = {label: ([], []) for label in labels}
        for run in range(args.runs):
            shift = run % len(labels)
            for label in labels[shift:] + labels[:shift]:
                mode, metrics = MODES[label]
                with request.start_as_current_span("POST /bench"):
                    measured = drain.measure(
                        backend=backend,
                        engine="sqlqueue",
                        process_count=1,
                        concurrency=args.concurrency,
                        jobs=args.jobs,
                        settings=settings,
                        job_type=job_type,
                        command=worker_command(
                            mode,
                            metrics=metrics,
                            concurrency=args.concurrency,
                            poll_interval=settings.poll_interval,
                        ),
                        queue_options={"tracer_provider": enqueuer},
                    )
                drains[label][0].append(measured.jobs_per_second)
                drains[label][1].append(measured.worker_cpu_ms_per_job * 1000)
        _print_table(backend, "worker", drains)
    print(f"\n{args.enqueue_jobs} enqueues, one per transaction, {args.runs} runs")
    for backend in backends:
        _print_table(
            backend, "enqueue", _enqueues(backend, settings.target, args.enqueue_jobs, args.runs)
        )
    return 0


def _enqueues(
    backend: str, target: Target, jobs: int, runs: int
) -> dict[str, tuple[list[float], list[float]]]:
    labels = list(ENQUEUE_MODES)
    measured: dict[str, tuple[list[float], list[float]]] = {label: ([], []) for label in labels}
    for run in range(runs):
        shift = run % len(labels)
        for label in labels[shift:] + labels[:shift]:
            with fresh_database(backend, target) as url:
                rate, cpu = enqueue_one_by_one(ENQUEUE_MODES[label](url), jobs)
            measured[label][0].append(rate)
            measured[label][1].append(cpu)
    return measured


def _print_table(
    backend: str, what: str, measured: dict[str, tuple[list[float], list[float]]]
) -> None:
    """One row per mode: jobs/s (median, min-max), its ratio to ``none`` (per run, then the
    median), CPU µs per job (median) and its ratio to ``none``."""
    rates, cpu = {k: v[0] for k, v in measured.items()}, {k: v[1] for k, v in measured.items()}
    print(f"\n{backend}")
    header = f"{'jobs/s (min-max)':>24} {'/none':>6} {'CPU µs/job':>11} {'/none':>6}"
    print(f"  {what:<20} {header}")
    for label in measured:
        ratio = statistics.median(
            mine / base for mine, base in zip(rates[label], rates["none"], strict=True)
        )
        cpu_ratio = statistics.median(
            mine / base for mine, base in zip(cpu[label], cpu["none"], strict=True)
        )
        print(
            f"  {label:<20} {_series(rates[label]):>24} {ratio:6.2f} "
            f"{statistics.median(cpu[label]):11.1f} {cpu_ratio:6.2f}",
            flush=True,
        )


if __name__ == "__main__":
    raise SystemExit(main())
