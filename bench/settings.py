"""What one benchmark run measures, and how big each measurement is."""

from __future__ import annotations

from dataclasses import dataclass

from bench.databases import Target

__all__ = ["EXTRA_SCENARIOS", "SCENARIOS", "Settings"]

#: Everything the default run measures, in the order it is measured.
SCENARIOS = ("enqueue", "bulk", "drain", "many", "pickup", "idle")
#: Run only when asked for with ``--only``: ``mvcc`` (a transaction held 10 minutes).
EXTRA_SCENARIOS = ("mvcc",)


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Sizes and knobs of a run; the defaults are issue 4's, ``--quick`` shrinks them."""

    backends: tuple[str, ...]
    runs: int
    target: Target
    scenarios: tuple[str, ...] = SCENARIOS
    enqueue_jobs: int = 2_000
    bulk_jobs: int = 20_000
    drain_jobs: int = 10_000
    #: (processes, concurrency per process) of each sqlqueue drain.
    drains: tuple[tuple[int, int], ...] = ((1, 1), (1, 10), (2, 10), (1, 100), (2, 100))
    #: The same, with an async no-op handler (no thread hop per job).
    async_drains: tuple[tuple[int, int], ...] = ((1, 100), (2, 100))
    #: Worker processes of the many-workers drain (PostgreSQL only).
    many_processes: int = 8
    many_concurrency: int = 10
    raw_batch: int = 100
    #: ``--peers``: jobs one worker process holds at once, per drain of the side-by-side table.
    peer_in_flight: tuple[int, ...] = (10, 100)
    pickup_jobs: int = 200
    pickup_gap_seconds: float = 0.020
    #: Both pickup workers' and the idle workers' poll interval (sqlqueue's default).
    poll_interval: float = 1.0
    pickup_concurrency: int = 10
    idle_seconds: float = 10.0
    timeout: float = 600.0
