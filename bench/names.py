"""Names the benchmark's processes share: job types, the app, environment variables."""

from __future__ import annotations

__all__ = ["APP", "NOOP", "RECORD_VARIABLE", "STAMP"]

#: The sqlqueue application the workers serve (``module:attribute``).
APP = "bench.app:queue"
#: A job that does nothing.
NOOP = "noop"
#: A job whose handler records when it started (pickup latency).
STAMP = "stamp"
#: Where ``stamp`` handlers append ``seq time.time()`` lines.
RECORD_VARIABLE = "SQLQUEUE_BENCH_RECORD"
