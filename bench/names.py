"""Names the benchmark's processes share: job types, the app, environment variables."""

from __future__ import annotations

__all__ = [
    "APP",
    "NOOP",
    "NOOP_ASYNC",
    "RECORD_VARIABLE",
    "SOAK_JOB",
    "SOAK_MAX_ATTEMPTS",
    "SOAK_PRUNE_INTERVAL_VARIABLE",
    "SOAK_RETENTION_VARIABLE",
    "SOAK_RETRY_SECONDS",
    "STAMP",
    "TENANT_JOB",
]

#: The sqlqueue application the workers serve (``module:attribute``).
APP = "bench.app:queue"
#: A job that does nothing (a sync handler: it runs in the worker's handler threads).
NOOP = "noop"
#: A job that does nothing in an async handler (it runs on the worker's event loop).
NOOP_ASYNC = "noop_async"
#: A job whose handler records when it started (pickup latency).
STAMP = "stamp"
#: Where ``stamp`` handlers append ``seq time.time()`` lines.
RECORD_VARIABLE = "SQLQUEUE_BENCH_RECORD"
#: The fairness benchmark's job: a little work for a tenant (``bench/fairness_app.py``).
TENANT_JOB = "bench.tenant_job"
#: The soak's job (``bench/soak_app.py``): ``{"fails": n}`` raises on its first n attempts.
SOAK_JOB = "soak"
#: Its attempts: a job that fails this many ends dead.
SOAK_MAX_ATTEMPTS = 3
#: The delay before each retry: short, so retried jobs finish within a sample.
SOAK_RETRY_SECONDS = 1.0
#: The soak app's retention window and prune interval (seconds), set by ``bench.soak``.
SOAK_RETENTION_VARIABLE = "SQLQUEUE_SOAK_RETENTION"
SOAK_PRUNE_INTERVAL_VARIABLE = "SQLQUEUE_SOAK_PRUNE_INTERVAL"
