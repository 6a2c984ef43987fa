"""``python -m bench --faults`` (or ``python -m bench.faults``): how fast workers drain while
the database fails a share of their statements.

The drain of ``python -m bench --only drain`` (a backlog released at once to burst workers;
jobs/s over the drain window on the database clock; every job must end ``succeeded``), with
each worker started through bench/faults_worker.py, which makes a seeded random share of its
statements raise a real transient driver error (a lock conflict, a serialization failure, a
dropped connection). Each run measures the healthy drain and one per failure rate, in an order
that rotates between runs; the ratio to the healthy drain is taken per run, then its median.

    python -m bench --faults                                  # 800 jobs, 2 x 10, 3 runs
    python -m bench.faults --rates 0.02,0.05 --runs 1 --backends sqlite   # a smoke run
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

from bench import drain
from bench.databases import DEFAULT_POSTGRES_URL, Target
from bench.names import APP
from bench.settings import Settings

__all__ = ["TARGETS", "main", "measure", "worker_command"]

#: Failure rate -> the least share of the healthy drain rate the workers must keep (issue 31).
TARGETS = {0.02: 0.5, 0.05: 0.25}


def worker_command(rate: float, *, seed: int, concurrency: int, poll_interval: float) -> list[str]:
    """One burst worker of ``bench.app`` whose statements fail at ``rate``."""
    command = [sys.executable, "-m", "bench.faults_worker", repr(rate), str(seed)]
    command += ["--log-level", "INFO", "worker", APP, "--concurrency", str(concurrency)]
    return [*command, "--poll-interval", repr(poll_interval), "--burst"]


def measure(
    settings: Settings,
    *,
    rates: Sequence[float],
    jobs: int,
    processes: int,
    concurrency: int,
    seed: int = 31,
) -> dict[str, dict[float, list[float]]]:
    """backend -> rate (0 = healthy) -> jobs/s of each run."""
    found: dict[str, dict[float, list[float]]] = {}
    plan = [0.0, *rates]
    for backend in settings.backends:
        found[backend] = {rate: [] for rate in plan}
        for run in range(settings.runs):
            shift = run % len(plan)
            for rate in plan[shift:] + plan[:shift]:
                measured = drain.measure(
                    backend=backend,
                    engine="sqlqueue",
                    process_count=processes,
                    concurrency=concurrency,
                    jobs=jobs,
                    settings=settings,
                    command=worker_command(
                        rate,
                        seed=seed + run,
                        concurrency=concurrency,
                        poll_interval=settings.poll_interval,
                    ),
                )
                found[backend][rate].append(measured.jobs_per_second)
                print(
                    f"run {run + 1}/{settings.runs} {backend:<10} {rate:6.1%} failing: "
                    f"{measured.jobs_per_second:9,.0f} jobs/s ({measured.window_seconds:.2f} s "
                    "window)",
                    file=sys.stderr,
                    flush=True,
                )
    return found


def table(found: dict[str, dict[float, list[float]]]) -> str:
    """One row per backend and rate: jobs/s (median, min-max), ratio to healthy, target."""
    lines = [
        f"{'backend':<11} {'failing':>8} {'jobs/s median (min-max)':>26} {'/healthy':>9} "
        f"{'(min-max)':>12} {'target':>7}"
    ]
    for backend, by_rate in found.items():
        healthy = by_rate[0.0]
        for rate, rates in by_rate.items():
            ratios = [mine / base for mine, base in zip(rates, healthy, strict=True)]
            target = TARGETS.get(rate)
            verdict = (
                ""
                if target is None
                else f"≥{target:g} " + ("ok" if statistics.median(ratios) >= target else "MISSED")
            )
            spread = f"({min(rates):,.0f}-{max(rates):,.0f})"
            lines.append(
                f"{backend:<11} {rate:8.1%} {statistics.median(rates):>12,.0f} {spread:>13} "
                f"{statistics.median(ratios):9.2f} {f'({min(ratios):.2f}-{max(ratios):.2f})':>12} "
                f"{verdict:>7}"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Measure and print the table."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.faults",
        description=(__doc__ or "").split("\n\n", 1)[0],
        epilog=(__doc__ or "").split("\n\n", 1)[-1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("--jobs", type=int, default=800, help="jobs per drain (800)")
    add("--runs", type=int, default=3, help="runs per rate (3)")
    add("--rates", default="0.02,0.05", help="failure rates besides healthy (0.02,0.05)")
    add("--processes", type=int, default=2, help="worker processes (2)")
    add("--concurrency", type=int, default=10, help="slots per worker (10)")
    add("--backends", default="sqlite,postgresql", help="sqlite,postgresql,mysql")
    add("--postgres-url", default=DEFAULT_POSTGRES_URL)
    add("--sqlite-dir", type=Path)
    add("--timeout", type=float, default=600.0, help="seconds per drain (600)")
    args = parser.parse_args(argv)
    rates = [float(part) for part in args.rates.split(",") if part.strip()]
    settings = Settings(
        backends=tuple(name.strip() for name in args.backends.split(",") if name.strip()),
        runs=args.runs,
        target=Target(postgres_url=args.postgres_url, sqlite_dir=args.sqlite_dir),
        timeout=args.timeout,
    )
    print(
        f"{args.jobs} no-op jobs, {args.processes} worker processes x concurrency "
        f"{args.concurrency}, {args.runs} runs; statements failing at random with transient "
        "driver errors (bench/faults_worker.py)",
        flush=True,
    )
    found = measure(
        settings,
        rates=rates,
        jobs=args.jobs,
        processes=args.processes,
        concurrency=args.concurrency,
    )
    print(table(found))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
