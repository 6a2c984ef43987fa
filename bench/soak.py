"""``python -m bench.soak`` (``nox -s soak``): a steady mix for half an hour, figures each minute.

Each backend (PostgreSQL and a SQLite file by default, at the same time, each in a fresh
database of its own) gets ``--rate`` jobs/s offered (a transaction of a tenth of them every
100 ms) and ``--workers`` real worker processes serving ``bench.soak_app``: 5 % of the jobs
fail their first attempt and are retried, 1 % fail every attempt and end dead, and retention
prunes finished jobs ``--retention`` seconds old every ``--prune-interval`` seconds, so the
table should reach a steady size. Every ``--interval`` seconds it records throughput, pickup
latency, the job table's size, dead tuples (PostgreSQL) and the workers' RSS
(``bench.soak_gauges``): first for ``--warmup-minutes`` (5), then for ``--minutes`` (30). The
warm-up's samples are shown and not judged: a soak judges a steady state, and a fresh job table
is not in one at first (its rows reach the retention bound after the window and two prune
passes, and PostgreSQL's indexes grow until VACUUM has pages of their own to recycle). At the
end it prints a table, writes ``soak-<backend>.md``, ``.png`` and ``.json`` to ``--output``, and
exits 3 if a check of ``bench.soak_report`` (on the measured samples) failed.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import processes, soak_report
from bench.databases import (
    DEFAULT_POSTGRES_URL,
    ROOT,
    Target,
    filesystem,
    fresh_database,
    git_commit,
)
from bench.names import (
    SOAK_MAX_ATTEMPTS,
    SOAK_PRUNE_INTERVAL_VARIABLE,
    SOAK_RETENTION_VARIABLE,
    SOAK_RETRY_SECONDS,
)
from bench.soak_gauges import Gauge
from bench.soak_load import Enqueuer, Vacuumer

__all__ = ["CHECK_FAILED", "SoakOptions", "main", "run"]

#: The exit status when the soak ran but a check failed (1 and 2 are errors and bad usage).
CHECK_FAILED = 3
_BACKENDS = ("postgresql", "sqlite")


@dataclass(frozen=True, kw_only=True)
class SoakOptions:
    """What the command line asked for."""

    backends: tuple[str, ...] = _BACKENDS
    minutes: float = 30.0
    rate: int = 100
    interval_seconds: float = 60.0
    retention_seconds: float = 90.0
    prune_interval_seconds: float = 30.0
    #: Sampled like the measured minutes, shown, and not judged (see the module doc).
    warmup_minutes: float = 5.0
    compare_samples: int = 5
    #: When the PostgreSQL server runs without autovacuum: the soak's own VACUUM's interval.
    vacuum_interval_seconds: float = 60.0
    workers: int = 2
    concurrency: int = 10
    poll_interval: float = 1.0


def _worker_command(options: SoakOptions) -> list[str]:
    command = [sys.executable, "-m", "sqlqueue", "--log-level", "INFO", "worker"]
    command += ["bench.soak_app:queue", "--concurrency", str(options.concurrency)]
    return [*command, "--poll-interval", repr(options.poll_interval)]


def _record(logs: Path, backend: str, n: int) -> Path:
    """Where worker ``n`` of ``backend`` appends its handlers' starts (``bench.soak_app``)."""
    return logs / f"starts-{backend}-{n}.txt"


def _check_alive(workers: Sequence[processes.Worker]) -> None:
    """Stop the soak with a worker's log if it exited (its planned failures log tracebacks,
    so ``Worker.check_alive`` would take them for a crash)."""
    for worker in workers:
        code = worker.process.poll()
        if code is not None:
            raise SystemExit(f"{worker.name} exited with {code}:\n{worker.log_text()[-3000:]}")


def _wait(seconds: float, workers: Sequence[processes.Worker]) -> None:
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        _check_alive(workers)
        time.sleep(min(1.0, left))


def run(options: SoakOptions, target: Target) -> dict[str, Any]:
    """Soak every backend of ``options`` at the same time; return every sample."""
    os.environ[SOAK_RETENTION_VARIABLE] = repr(options.retention_seconds)
    os.environ[SOAK_PRUNE_INTERVAL_VARIABLE] = repr(options.prune_interval_seconds)
    found: dict[str, Any] = {
        "options": asdict(options),
        "started_utc": datetime.now(UTC).strftime("%Y-%m-%d %H:%M"),
        "load_average_at_start": [round(v, 2) for v in os.getloadavg()],
        "cpus": os.cpu_count(),
        "max_attempts": SOAK_MAX_ATTEMPTS,
        "retry_seconds": SOAK_RETRY_SECONDS,
    }
    stop = threading.Event()
    with ExitStack() as stack:
        logs = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="sqlqueue-soak-")))
        urls = {b: stack.enter_context(fresh_database(b, target)) for b in options.backends}
        workers = {
            backend: [
                processes.start(
                    _worker_command(options),
                    engine="sqlqueue",
                    name=f"soak-{backend}-{n}",
                    url=url,
                    logs=logs,
                    record=_record(logs, backend, n),
                )
                for n in range(options.workers)
            ]
            for backend, url in urls.items()
        }
        everyone = [worker for group in workers.values() for worker in group]
        stack.callback(processes.stop_all, everyone)
        processes.wait_ready(everyone, 120.0)
        enqueuers = {b: Enqueuer(url, options.rate, stop) for b, url in urls.items()}
        for enqueuer in enqueuers.values():
            enqueuer.start()
            stack.callback(enqueuer.join, 30)
        stack.callback(stop.set)
        if "postgresql" in urls and Vacuumer.needed(urls["postgresql"]):
            vacuumer = Vacuumer(urls["postgresql"], options.vacuum_interval_seconds, stop)
            vacuumer.start()
            stack.callback(vacuumer.join, 120)
            found["vacuum_stand_in"] = vacuumer
            print(
                "the PostgreSQL server runs without autovacuum: VACUUM (ANALYZE) sqlqueue_jobs "
                f"every {options.vacuum_interval_seconds:g} s stands in for it",
                flush=True,
            )
        gauges = {
            b: Gauge(
                b,
                url,
                admin_url=target.postgres_url,
                records=[_record(logs, b, n) for n in range(options.workers)],
            )
            for b, url in urls.items()
        }
        for gauge in gauges.values():
            stack.callback(gauge.close)
        rows: dict[str, list[dict[str, Any]]] = {backend: [] for backend in urls}
        warmup = round(options.warmup_minutes * 60.0 / options.interval_seconds)
        samples = warmup + max(1, round(options.minutes * 60.0 / options.interval_seconds))
        print(f"warming up for {options.warmup_minutes:g} min (sampled, not judged)", flush=True)
        started = time.monotonic()
        for n in range(1, samples + 1):
            _wait(started + n * options.interval_seconds - time.monotonic(), everyone)
            for backend, gauge in gauges.items():
                row = gauge.sample([worker.pid for worker in workers[backend]])
                # Minutes since the warm-up ended: the warm-up's samples have minute <= 0.
                row["minute"] = (n - warmup) * options.interval_seconds / 60.0
                row["warmup"] = n <= warmup
                row["load_1m"] = os.getloadavg()[0]
                rows[backend].append(row)
            print(_progress(rows), flush=True)
        stop.set()
    found["load_average_at_end"] = [round(v, 2) for v in os.getloadavg()]
    vacuumer = found.pop("vacuum_stand_in", None)
    found["autovacuum"] = (
        "on (the server's)"
        if vacuumer is None
        else f"off on the server; the soak ran VACUUM (ANALYZE) sqlqueue_jobs every "
        f"{options.vacuum_interval_seconds:g} s instead ({vacuumer.vacuums} times, "
        f"{len(vacuumer.errors)} errors)"
    )
    found["backends"] = {
        backend: {
            "rows": rows[backend],
            "enqueued": enqueuers[backend].enqueued,
            "enqueue_errors": len(enqueuers[backend].errors),
            "first_enqueue_errors": enqueuers[backend].errors[:3],
        }
        for backend in urls
    }
    return found


def _progress(rows: dict[str, list[dict[str, Any]]]) -> str:
    parts = []
    for backend, samples in rows.items():
        row = samples[-1]
        p99 = row["pickup_p99_ms"]
        parts.append(
            f"{backend}: {row['jobs_per_s']:.0f} jobs/s, p99 "
            f"{'-' if p99 is None else f'{p99:.0f}'} ms, {row['size_mb']:.1f} MB, "
            f"{row['rows']:,} rows, RSS {row['worker_rss_mb']:.0f} MB"
        )
    return f"[{samples[-1]['minute']:5.1f} min] " + "; ".join(parts)


def save(found: dict[str, Any], output: Path) -> bool:
    """Print each backend's table, write its note, plot and JSON; True when every check held."""
    output.mkdir(parents=True, exist_ok=True)
    passed = True
    for backend, data in found["backends"].items():
        verdict = soak_report.checks(data["rows"], found["options"])
        passed = passed and all(check.passed for check in verdict)
        print(soak_report.table(backend, data["rows"], verdict), flush=True)
        stem = output / f"soak-{backend}"
        stem.with_suffix(".md").write_text(
            soak_report.markdown(backend, found, verdict), encoding="utf-8"
        )
        stem.with_suffix(".json").write_text(
            json.dumps({**found, "backends": {backend: data}}, indent=1) + "\n", encoding="utf-8"
        )
        if not soak_report.plot(backend, found, stem.with_suffix(".png")):
            print("no plot: matplotlib is missing (pip install -e '.[bench]')", flush=True)
    return passed


def _parser() -> argparse.ArgumentParser:
    defaults = SoakOptions()
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak",
        description=(__doc__ or "").split("\n\n", 1)[0],
        epilog=(__doc__ or "").split("\n\n", 1)[-1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("--backends", default=",".join(_BACKENDS), help="postgresql,sqlite (both)")
    add("--minutes", type=float, default=defaults.minutes, help="measured minutes (30)")
    add("--rate", type=int, default=defaults.rate, help="jobs/s offered to each backend (100)")
    add("--interval", type=float, default=defaults.interval_seconds, help="s per sample (60)")
    add(
        "--retention",
        type=float,
        default=defaults.retention_seconds,
        help="seconds finished jobs are kept (90); at least 1.5 intervals, as throughput is "
        "counted from finished rows",
    )
    add("--prune-interval", type=float, default=defaults.prune_interval_seconds, help="(30 s)")
    add(
        "--warmup-minutes",
        type=float,
        default=defaults.warmup_minutes,
        help="minutes sampled before the measured ones and not judged (5): the job table's "
        "indexes fill to their steady size",
    )
    add(
        "--vacuum-interval",
        type=float,
        default=defaults.vacuum_interval_seconds,
        help="seconds between the soak's VACUUMs of the job table when the PostgreSQL server "
        "runs without autovacuum (60: autovacuum's default naptime)",
    )
    add("--compare", type=int, default=defaults.compare_samples, help="samples compared (5)")
    add("--workers", type=int, default=defaults.workers, help="worker processes per backend (2)")
    add("--concurrency", type=int, default=defaults.concurrency, help="per worker (10)")
    add("--poll-interval", type=float, default=defaults.poll_interval, help="workers' (1.0 s)")
    add("--postgres-url", default=DEFAULT_POSTGRES_URL, help="server for a scratch database")
    add("--sqlite-dir", type=Path, help="directory for the SQLite file (the system temp dir)")
    add("--output", type=Path, default=ROOT / "bench" / "results", help="(bench/results)")
    add(
        "--show",
        type=Path,
        nargs="+",
        metavar="JSON",
        help="instead: judge and write again the notes and plots of saved soak-<backend>.json "
        "files (into --output); measure nothing",
    )
    return parser


def _options(args: argparse.Namespace, parser: argparse.ArgumentParser) -> SoakOptions:
    backends = tuple(part.strip() for part in args.backends.split(",") if part.strip())
    if not backends or set(backends) - set(_BACKENDS):
        parser.error(f"--backends: expected some of postgresql,sqlite, got {args.backends!r}")
    positive = ("minutes", "rate", "interval", "prune_interval", "vacuum_interval", "workers")
    for name in (*positive, "concurrency"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)!r}")
    if args.retention < 1.5 * args.interval:
        parser.error(
            f"--retention ({args.retention:g} s) must be at least 1.5 times --interval "
            f"({args.interval:g} s): jobs finished in an interval are counted from their rows"
        )
    if args.compare < 1:
        parser.error(f"--compare must be >= 1, got {args.compare!r}")
    if args.warmup_minutes < 0:
        parser.error(f"--warmup-minutes must be >= 0, got {args.warmup_minutes!r}")
    return SoakOptions(
        backends=backends,
        minutes=args.minutes,
        rate=args.rate,
        interval_seconds=args.interval,
        retention_seconds=args.retention,
        prune_interval_seconds=args.prune_interval,
        warmup_minutes=args.warmup_minutes,
        compare_samples=args.compare,
        vacuum_interval_seconds=args.vacuum_interval,
        workers=args.workers,
        concurrency=args.concurrency,
        poll_interval=args.poll_interval,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.show:
        passed = True
        for path in args.show:
            passed = save(json.loads(path.read_text(encoding="utf-8")), args.output) and passed
        return 0 if passed else CHECK_FAILED
    options = _options(args, parser)
    target = Target(postgres_url=args.postgres_url, sqlite_dir=args.sqlite_dir)
    found = run(options, target)
    found["command"] = shlex.join(["python", "-m", "bench.soak", *(argv or sys.argv[1:])])
    found["commit"] = git_commit()
    found["sqlite_filesystem"] = filesystem(args.sqlite_dir or Path(tempfile.gettempdir()))
    return 0 if save(found, args.output) else CHECK_FAILED


if __name__ == "__main__":
    raise SystemExit(main())
