"""Names the benchmark's processes share: job types, the app, environment variables."""

from __future__ import annotations

__all__ = ["APP", "NOOP", "NOOP_ASYNC", "RECORD_VARIABLE", "STAMP", "TENANT_JOB"]

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
