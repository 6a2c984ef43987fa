"""How fast sqlqueue drains a backlog, next to a raw-SQL ceiling on the same database.

For each backend, number of worker processes and run: make a fresh database, migrate it,
enqueue ``--jobs`` no-op jobs, then drain them with

* **sqlqueue**: ``python -m sqlqueue worker bench.noop_app:queue --burst --concurrency 10``
  in each of P processes;
* **raw SQL**: ``python -m bench.raw_worker`` in each of P processes: the same claim and complete
  written by hand with the same driver, 100 jobs per claim statement.

Throughput is jobs divided by the drain window measured on the database clock: from the first
claim (earliest ``started_at``) to the last completion (latest ``finished_at``), so interpreter
start-up is not counted; the wall time including start-up is in the JSON too. Each figure is
the median of ``--runs`` runs with the min-max spread; the sqlqueue/raw ratio is taken per run
(both measured back to back) and summarised the same way.

Run from the repository root::

    python -m bench.drain --jobs 5000 --runs 3 --json drain.json
    python bench/drain.py --backends sqlite --processes 1,4
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa

import sqlqueue

#: The repository root: worker processes run there, with it on PYTHONPATH, to import ``bench``.
ROOT = Path(__file__).resolve().parent.parent

NOOP = "noop"  # the task of bench/noop_app.py
ENGINES = ("sqlqueue", "raw")
DEFAULT_POSTGRES_URL = os.environ.get(
    "SQLQUEUE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


@dataclass(frozen=True, kw_only=True)
class Drain:
    """One drain: how many jobs, the window on the database clock and the wall time."""

    jobs: int
    window_seconds: float
    wall_seconds: float

    @property
    def jobs_per_second(self) -> float:
        return self.jobs / self.window_seconds if self.window_seconds > 0 else float("inf")

    @property
    def wall_jobs_per_second(self) -> float:
        return self.jobs / self.wall_seconds


@dataclass(frozen=True, kw_only=True)
class Spread:
    """Median and range of a series of figures."""

    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        return cls(median=statistics.median(values), low=min(values), high=max(values))


@dataclass(kw_only=True)
class Cell:
    """Every run of one (backend, processes) pair, for both engines."""

    backend: str
    processes: int
    runs: dict[str, list[Drain]] = field(default_factory=lambda: {e: [] for e in ENGINES})

    def rate(self, engine: str) -> Spread:
        return Spread.of([d.jobs_per_second for d in self.runs[engine]])

    def wall_rate(self, engine: str) -> Spread:
        return Spread.of([d.wall_jobs_per_second for d in self.runs[engine]])

    def ratio(self) -> Spread:
        pairs = zip(self.runs["sqlqueue"], self.runs["raw"], strict=True)
        return Spread.of([sq.jobs_per_second / raw.jobs_per_second for sq, raw in pairs])


# -- fresh databases -----------------------------------------------------------------------------


@contextmanager
def fresh_sqlite() -> Iterator[str]:
    """A new SQLite file (sqlqueue switches it to WAL), deleted afterwards."""
    with tempfile.TemporaryDirectory(prefix="sqlqueue-bench-") as directory:
        yield f"sqlite:///{Path(directory) / 'drain.db'}"


@contextmanager
def fresh_postgres(admin_url: str) -> Iterator[str]:
    """A new PostgreSQL database next to ``admin_url``'s, dropped afterwards."""
    admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
    name = f"sqlqueue_bench_{secrets.token_hex(4)}"  # generated here: safe to quote into DDL
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield sa.make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


@contextmanager
def fresh_database(backend: str, postgres_url: str) -> Iterator[str]:
    if backend == "sqlite":
        with fresh_sqlite() as url:
            yield url
    else:
        with fresh_postgres(postgres_url) as url:
            yield url


# -- one drain -----------------------------------------------------------------------------------


def prepare(url: str, jobs: int) -> None:
    """Migrate and enqueue ``jobs`` no-op jobs in batches of 1,000."""
    engine = sa.create_engine(url)
    try:
        sqlqueue.migrate(engine)
        queue = sqlqueue.Queue(engine)
        for start in range(0, jobs, 1000):
            batch = [
                sqlqueue.JobRequest(job_type=NOOP, external=True)
                for _ in range(start, min(start + 1000, jobs))
            ]
            with engine.begin() as conn:
                queue.enqueue_many(conn, batch)
    finally:
        engine.dispose()


def worker_command(engine: str, url: str, concurrency: int) -> list[str]:
    if engine == "sqlqueue":
        return [
            sys.executable,
            "-m",
            "sqlqueue",
            "--log-level",
            "WARNING",
            "worker",
            "bench.noop_app:queue",
            "--burst",
            "--concurrency",
            str(concurrency),
        ]
    return [sys.executable, "-m", "bench.raw_worker", url]


def run_processes(commands: list[list[str]], url: str, timeout: float) -> float:
    """Start every command at once, wait for all; return the wall time. Fail loudly."""
    env = {**os.environ, "SQLQUEUE_DATABASE_URL": url, "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryDirectory(prefix="sqlqueue-bench-logs-") as logs:
        started = time.perf_counter()
        running: list[tuple[subprocess.Popen[bytes], Path]] = []
        for number, command in enumerate(commands):
            log = Path(logs) / f"worker-{number}.log"
            with log.open("wb") as sink:
                process = subprocess.Popen(
                    command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=sink
                )
            running.append((process, log))
        deadline = started + timeout
        for process, log in running:
            try:
                code = process.wait(timeout=max(deadline - time.perf_counter(), 0.1))
            except subprocess.TimeoutExpired:
                for other, _ in running:
                    other.kill()
                raise SystemExit(
                    f"a worker ran past --timeout {timeout:g} s: {log.read_text()}"
                ) from None
            if code != 0:
                raise SystemExit(f"worker exited with {code}:\n{log.read_text()[-3000:]}")
        return time.perf_counter() - started


def _timestamp(value: Any) -> datetime:
    return value if isinstance(value, datetime) else datetime.fromisoformat(str(value))


def measure_window(url: str, jobs: int) -> float:
    """Check every job succeeded; return seconds from the first claim to the last completion."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            counts = sa.text("SELECT status, count(*) FROM sqlqueue_jobs GROUP BY status")
            by_status = {str(status): int(n) for status, n in conn.execute(counts)}
            first, last = conn.execute(
                sa.text("SELECT min(started_at), max(finished_at) FROM sqlqueue_jobs")
            ).one()
    finally:
        engine.dispose()
    if by_status != {"succeeded": jobs}:
        raise SystemExit(f"the drain left {by_status}, expected {{'succeeded': {jobs}}}")
    return (_timestamp(last) - _timestamp(first)).total_seconds()


def drain_once(*, backend: str, engine: str, processes: int, args: argparse.Namespace) -> Drain:
    with fresh_database(backend, args.postgres_url) as url:
        prepare(url, args.jobs)
        commands = [worker_command(engine, url, args.concurrency) for _ in range(processes)]
        wall = run_processes(commands, url, args.timeout)
        window = measure_window(url, args.jobs)
    return Drain(jobs=args.jobs, window_seconds=window, wall_seconds=wall)


# -- reporting -----------------------------------------------------------------------------------


def _rate(spread: Spread) -> str:
    return f"{spread.median:>7,.0f} ({spread.low:,.0f}-{spread.high:,.0f})"


def table(cells: Sequence[Cell]) -> str:
    header = (
        f"{'backend':<11}{'procs':>5}  {'sqlqueue jobs/s':<24}{'raw SQL jobs/s':<26}"
        f"{'sqlqueue/raw':<20}{'sqlqueue incl. start-up':<24}"
    )
    lines = [header, "-" * len(header)]
    for cell in cells:
        ratio = cell.ratio()
        lines.append(
            f"{cell.backend:<11}{cell.processes:>5}  {_rate(cell.rate('sqlqueue')):<24}"
            f"{_rate(cell.rate('raw')):<26}"
            f"{f'{ratio.median:.2f} ({ratio.low:.2f}-{ratio.high:.2f})':<20}"
            f"{_rate(cell.wall_rate('sqlqueue')):<24}"
        )
    return "\n".join(lines)


def environment(args: argparse.Namespace, backends: Sequence[str]) -> dict[str, Any]:
    facts: dict[str, Any] = {
        "jobs": args.jobs,
        "runs": args.runs,
        "concurrency_per_sqlqueue_process": args.concurrency,
        "raw_claim_batch": 100,
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "sqlalchemy": sa.__version__,
        "sqlqueue": sqlqueue.__version__,
        "sqlite": sqlite3.sqlite_version,
        "load_average_at_start": list(os.getloadavg()),
    }
    if "postgresql" in backends:
        engine = sa.create_engine(args.postgres_url)
        with engine.connect() as conn:
            facts["postgresql"] = conn.scalar(sa.text("SHOW server_version"))
        engine.dispose()
    return facts


def report(cells: Sequence[Cell], facts: dict[str, Any]) -> dict[str, Any]:
    rows = []
    for cell in cells:
        row: dict[str, Any] = {"backend": cell.backend, "processes": cell.processes}
        for engine in ENGINES:
            row[engine] = {
                "jobs_per_second": asdict(cell.rate(engine)),
                "wall_jobs_per_second": asdict(cell.wall_rate(engine)),
                "runs": [
                    {**asdict(d), "jobs_per_second": d.jobs_per_second} for d in cell.runs[engine]
                ],
            }
        row["sqlqueue_to_raw"] = asdict(cell.ratio())
        rows.append(row)
    return {"environment": facts, "results": rows}


# -- main ----------------------------------------------------------------------------------------


def _names(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Drain throughput of sqlqueue vs a raw-SQL ceiling.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1] if __doc__ else None,
    )
    parser.add_argument("--jobs", type=int, default=10_000, help="jobs per drain (10,000)")
    parser.add_argument("--runs", type=int, default=3, help="runs per figure (3)")
    parser.add_argument("--backends", default="sqlite,postgresql", help="sqlite,postgresql")
    parser.add_argument("--processes", default="1,4", help="worker process counts (1,4)")
    parser.add_argument("--concurrency", type=int, default=10, help="per sqlqueue process (10)")
    parser.add_argument(
        "--postgres-url",
        default=DEFAULT_POSTGRES_URL,
        help="a database to connect to for CREATE/DROP DATABASE "
        "(default: $SQLQUEUE_TEST_POSTGRES_URL or postgres@127.0.0.1:5432/test)",
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per drain (600)")
    parser.add_argument("--json", type=Path, help="also write the results here as JSON")
    args = parser.parse_args(argv)
    args.backend_list = _names(args.backends)
    unknown = set(args.backend_list) - {"sqlite", "postgresql"}
    if unknown or not args.backend_list:
        parser.error(f"--backends: expected sqlite and/or postgresql, got {args.backends!r}")
    try:
        args.process_list = [int(n) for n in _names(args.processes)]
    except ValueError:
        parser.error(f"--processes: expected numbers such as 1,4, got {args.processes!r}")
    if not args.process_list or min(args.process_list) < 1:
        parser.error("--processes: each count must be >= 1")
    if args.jobs < 1 or args.runs < 1 or args.concurrency < 1:
        parser.error("--jobs, --runs and --concurrency must be >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    facts = environment(args, args.backend_list)
    load = facts["load_average_at_start"][0]
    if load > (os.cpu_count() or 1):
        print(
            f"warning: load average {load:.1f} on {os.cpu_count()} CPUs: other work is running, "
            "expect noisy figures",
            file=sys.stderr,
        )
    cells = [
        Cell(backend=backend, processes=processes)
        for backend in args.backend_list
        for processes in args.process_list
    ]
    for run in range(args.runs):
        for cell in cells:
            # Alternate which engine goes first, so neither always gets the warmer machine.
            order = ENGINES if run % 2 == 0 else ENGINES[::-1]
            for engine in order:
                drain = drain_once(
                    backend=cell.backend, engine=engine, processes=cell.processes, args=args
                )
                cell.runs[engine].append(drain)
                print(
                    f"run {run + 1}/{args.runs} {cell.backend} x{cell.processes} {engine:<8} "
                    f"{drain.jobs_per_second:>9,.0f} jobs/s "
                    f"({drain.window_seconds:.2f} s drain, {drain.wall_seconds:.2f} s wall)",
                    file=sys.stderr,
                    flush=True,
                )
    print(
        f"\n{args.jobs:,} no-op jobs per drain, median of {args.runs} run(s) (min-max); "
        f"{facts['cpus']} CPUs, SQLite {facts['sqlite']}"
        + (f", PostgreSQL {facts['postgresql']}" if "postgresql" in facts else "")
        + f"; {args.concurrency} handler slots per sqlqueue process, raw claims 100 per statement"
    )
    print(table(cells))
    facts["load_average_at_end"] = list(os.getloadavg())
    if args.json:
        args.json.write_text(json.dumps(report(cells, facts), indent=2) + "\n", encoding="utf-8")
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
