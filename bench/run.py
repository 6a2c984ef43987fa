"""``python -m bench``: sqlqueue against its raw-SQL ceiling on SQLite and PostgreSQL, one table.

Run from the repository root (``pip install -e '.[postgres]'`` first, or ``nox -s bench``)::

    python -m bench                          # everything, 3 runs, both backends
    python -m bench --quick --backends sqlite  # a smoke run
    python -m bench --json new.json --compare old.json
    python -m bench --show new.json --compare old.json   # print saved runs, measure nothing
    python -m bench --memory 1000000 --backends postgresql  # worker RSS over a long drain
    python -m bench --peers                  # next to pgqueuer and procrastinate (PostgreSQL)
    python -m bench --faults                 # drains while statements fail (bench/faults.py)
    python -m bench --only mvcc              # under a transaction held 10 min (bench/mvcc.py)
    python -m bench --only fairness          # concurrency limits (bench/fairness.py)
    python -m bench --only workflows         # workflows' enqueue and drain (bench/workflows.py)
    python -m bench --only backlog           # claims behind unknown types' jobs (bench/backlog.py)
    python -m bench compare main             # this tree against main (bench/compare.py)

Each figure is the median of ``--runs`` runs with the min-max spread; ``sqlqueue/raw`` is the
per-run ratio of the two engines measured back to back. bench/README.md explains each figure.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import sys
import time
from collections.abc import Sequence
from importlib.metadata import version as package_version
from pathlib import Path
from types import FrameType
from typing import Any

# fairness and mvcc import private sqlqueue modules: they are imported where they are used, so
# `python -m bench compare` can run the drain and enqueue scenarios against older revisions.
from bench import (
    backlog,
    faults,
    memory,
    middleware,
    middleware_instructions,
    peers,
    report,
    side_by_side,
    workflows,
)
from bench.databases import (
    BACKENDS,
    DEFAULT_MYSQL_URL,
    DEFAULT_POSTGRES_URL,
    Target,
    environment,
    git_commit,
)
from bench.runner import Runner
from bench.settings import EXTRA_SCENARIOS, SCENARIOS, Settings

__all__ = ["main"]

#: ``--quick``: small enough for a smoke run (the test suite runs it on SQLite).
QUICK: dict[str, Any] = {
    "enqueue_jobs": 200,
    "bulk_jobs": 2_000,
    "drain_jobs": 500,
    "pickup_jobs": 20,
    "idle_seconds": 1.0,
    "async_drains": ((1, 10),),
}
DEFAULT_MEMORY_JOBS = 200_000


def _names(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _drains(text: str) -> tuple[tuple[int, int], ...]:
    """``1x1,1x10,2x10`` -> ((1, 1), (1, 10), (2, 10))."""
    configs = []
    for part in _names(text):
        processes, _, concurrency = part.partition("x")
        configs.append((int(processes), int(concurrency)))
    if not configs or min(min(pair) for pair in configs) < 1:
        raise ValueError(text)
    return tuple(configs)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description=(__doc__ or "").split("\n\n", 1)[0],
        epilog=(__doc__ or "").split("\n\n", 1)[-1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("--backends", default=",".join(BACKENDS), help="sqlite,postgresql,mysql (all)")
    add("--runs", type=int, help="runs per figure (3; 1 with --quick)")
    add("--quick", action="store_true", help="small sizes for a smoke run")
    add("--json", type=Path, metavar="PATH", help="also write every run here as JSON")
    add("--compare", type=Path, metavar="OLD", help="print changes against this saved run")
    add("--show", type=Path, metavar="SAVED", help="print a saved run's table; measure nothing")
    add(
        "--only",
        help=f"scenarios to run, of {','.join(SCENARIOS)} (all), or "
        f"{','.join(EXTRA_SCENARIOS)} (not in the default run); or 'middleware' alone: drain "
        "throughput with no middleware and with one empty one (bench/middleware.py); or "
        "'fairness' alone: concurrency limits (bench/fairness.py); or "
        "'workflows' alone: a 10,000-step workflow's enqueue, and two-step chains' drain rate "
        "against plain jobs' (bench/workflows.py); or 'backlog' alone: a worker's claim behind "
        "due jobs of types it does not know (bench/backlog.py)",
    )
    add("--backlog-jobs", type=int, default=20_000, help="backlog: unknown-type due jobs")
    add("--fairness-big", type=int, default=20_000, help="fairness: the big tenant's jobs")
    add("--fairness-keys", type=int, default=1_000, help="fairness: keys at their limit")
    add("--fairness-due", type=int, default=100_000, help="fairness: due jobs behind them")
    add(
        "--instructions",
        action="store_true",
        help="with --only middleware: also count the drains' instructions under valgrind's "
        "callgrind, steady however busy the machine (minutes; bench/middleware_instructions.py)",
    )
    add(
        "--memory",
        type=int,
        nargs="?",
        const=DEFAULT_MEMORY_JOBS,
        metavar="N",
        help=f"instead: drain N jobs in one worker, sampling its RSS ({DEFAULT_MEMORY_JOBS:,})",
    )
    add(
        "--postgres-url",
        default=DEFAULT_POSTGRES_URL,
        help="server where scratch databases are created (default: $SQLQUEUE_TEST_POSTGRES_URL "
        "or postgres@127.0.0.1:5432/test); the role needs CREATEDB",
    )
    add(
        "--mysql-url",
        default=DEFAULT_MYSQL_URL,
        help="MariaDB/MySQL server for scratch databases (default: $SQLQUEUE_TEST_MYSQL_URL "
        "or root@127.0.0.1:3306/test)",
    )
    add("--sqlite-dir", type=Path, help="directory for SQLite files (the system temp dir)")
    add("--poll-interval", type=float, default=1.0, help="pickup and idle workers' (1.0 s)")
    add("--idle-seconds", type=float, help="how long idle CPU is watched (10)")
    add("--drain-jobs", type=int, help="jobs per drain (10,000)")
    add("--drains", help="sqlqueue drains as PROCESSESxCONCURRENCY (1x1,1x10,2x10,1x100,2x100)")
    add(
        "--async-drains",
        help="drains with an async no-op handler, as --drains (1x100,2x100; 'none': none)",
    )
    add(
        "--peers",
        action="store_true",
        help="instead: sqlqueue next to pgqueuer, procrastinate and raw SQL on PostgreSQL "
        "(pip install -e '.[bench]'); --only narrows it to some of drain,enqueue,bulk,pickup",
    )
    add(
        "--faults",
        action="store_true",
        help="instead: drains while 2 %% and 5 %% of the workers' statements fail "
        "(bench/faults.py; "
        "--runs, --backends, --drain-jobs (800))",
    )
    add("--in-flight", default="10,100", help="--peers: jobs held by one worker (10,100)")
    add("--many-processes", type=int, default=8, help="PostgreSQL many-workers drain (8; 0: off)")
    add("--timeout", type=float, default=600.0, help="seconds allowed per measurement (600)")
    add("--mvcc-minutes", type=float, default=10.0, help="mvcc: minutes the transaction is held")
    add("--mvcc-rate", type=int, default=250, help="mvcc: jobs/s offered to each system (250)")
    add("--mvcc-warmup", type=float, default=60.0, help="mvcc: seconds before the hold (60)")
    add(
        "--mvcc-systems",
        help="mvcc: systems side by side (sqlqueue,pgqueuer,raw; sqlqueue-nofloor: without its "
        "claim floor; sqlqueue-noprobe: the floor without its probe; raw-fillfactor, raw-floor, "
        "raw-timefloor, raw-hot: the raw layouts of bench/mvcc_layouts.py)",
    )
    add(
        "--mvcc-output",
        type=Path,
        help="mvcc: results go to OUTPUT.md, .png and .json (bench/results/mvcc)",
    )
    return parser


def _settings(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Settings:
    backends = tuple(_names(args.backends))
    if not backends or set(backends) - set(BACKENDS):
        parser.error(f"--backends: expected sqlite, postgresql, mysql, got {args.backends!r}")
    scenarios = tuple(_names(args.only)) if args.only else SCENARIOS
    if not scenarios or set(scenarios) - {*SCENARIOS, *EXTRA_SCENARIOS}:
        parser.error(f"--only: expected some of {','.join(SCENARIOS)}, got {args.only!r}")
    if "mvcc" in scenarios:
        backends = ("postgresql",)
    sizes: dict[str, Any] = dict(QUICK) if args.quick else {}
    if args.drain_jobs is not None:
        sizes["drain_jobs"] = args.drain_jobs
    if args.idle_seconds is not None:
        sizes["idle_seconds"] = args.idle_seconds
    if args.drains:
        try:
            sizes["drains"] = _drains(args.drains)
        except ValueError:
            parser.error(f"--drains: expected e.g. 1x1,1x10,2x10, got {args.drains!r}")
    if args.async_drains:
        try:
            sizes["async_drains"] = (
                () if args.async_drains == "none" else _drains(args.async_drains)
            )
        except ValueError:
            parser.error(f"--async-drains: expected e.g. 1x100 or none, got {args.async_drains!r}")
    try:
        sizes["peer_in_flight"] = tuple(int(n) for n in _names(args.in_flight))
    except ValueError:
        parser.error(f"--in-flight: expected e.g. 10,100, got {args.in_flight!r}")
    if not sizes["peer_in_flight"] or min(sizes["peer_in_flight"]) < 1:
        parser.error(f"--in-flight: expected e.g. 10,100, got {args.in_flight!r}")
    if args.peers:
        backends = ("postgresql",)
    runs = args.runs if args.runs is not None else (1 if args.quick else 3)
    if runs < 1 or args.poll_interval <= 0 or args.many_processes < 0:
        parser.error("--runs must be >= 1, --poll-interval > 0, --many-processes >= 0")
    return Settings(
        backends=backends,
        runs=runs,
        target=Target(
            postgres_url=args.postgres_url, sqlite_dir=args.sqlite_dir, mysql_url=args.mysql_url
        ),
        scenarios=scenarios,
        poll_interval=args.poll_interval,
        many_processes=args.many_processes,
        timeout=args.timeout,
        **sizes,
    )


def _load() -> list[float]:
    return [round(value, 2) for value in os.getloadavg()]


def _header(facts: dict[str, Any], settings: Settings) -> str:
    lines = [
        f"sqlqueue {facts['sqlqueue']} ({facts['sqlqueue_commit']}), Python {facts['python']}, "
        f"SQLAlchemy {facts['sqlalchemy']}, psycopg {facts['psycopg']}, {facts['cpus']} CPUs; "
        f"median of {settings.runs} run(s) (min-max)"
    ]
    durability = facts["durability"]
    if "sqlite" in durability:
        d = durability["sqlite"]
        lines.append(
            f"SQLite {facts['sqlite_library']} file on {facts['sqlite_filesystem']}: "
            f"journal_mode={d['journal_mode']}, synchronous={d['synchronous']}, "
            f"busy_timeout={d['busy_timeout']} ms (sqlqueue's worker commits at "
            "synchronous=NORMAL, per transaction, and the raw worker per session)"
        )
    if "postgresql" in durability:
        d = durability["postgresql"]
        lines.append(
            f"PostgreSQL {d['server_version']} on loopback: "
            f"synchronous_commit={d['synchronous_commit']}, fsync={d['fsync']}, "
            f"wal_sync_method={d['wal_sync_method']}, full_page_writes={d['full_page_writes']} "
            "(sqlqueue's worker and the raw worker commit claims and outcomes with "
            "synchronous_commit=off; enqueues at the server's level)"
        )
    if "mysql" in durability:
        d = durability["mysql"]
        lines.append(
            f"MariaDB/MySQL {d['version']} on loopback: innodb_flush_log_at_trx_commit="
            f"{d['innodb_flush_log_at_trx_commit']}, sync_binlog={d['sync_binlog']}, "
            f"innodb_buffer_pool_size={d['innodb_buffer_pool_size']} (no per-transaction "
            "durability setting: sqlqueue and raw commit alike)"
        )
    return "\n".join(lines)


def _legend(settings: Settings) -> str:
    return (
        "raw SQL = the same operation hand-written with the same driver, same run: INSERT … "
        "RETURNING id + COMMIT; multi-row INSERT (1,000 rows/statement) RETURNING id; drains: "
        f"claim {settings.raw_batch}/statement + fenced complete, autocommit, same process "
        "count; pickup and idle: a polling loop at the same poll interval.\n"
        "sqlqueue/raw: per-run ratio (jobs/s: higher is better; ms and % CPU: lower is "
        "better). Drains: jobs / (last finished_at - first started_at) on the database clock.\n"
        "Pickup: time.time() right after the enqueuer's COMMIT returns to time.time() at "
        f"handler start, both on this machine; {settings.pickup_jobs} jobs "
        f"{settings.pickup_gap_seconds * 1000:g} ms apart into an idle worker "
        f"(concurrency {settings.pickup_concurrency})."
    )


def _print_compare(path: Path, results: report.Results) -> None:
    old, old_facts = report.load(path)
    print(f"\nchanges against {path} ({old_facts.get('sqlqueue_commit', '?')}, median vs median):")
    print(report.compare_table(old.rows, results.rows))


def _exit_on_sigterm(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds: workers are stopped, scratch databases dropped


def main(argv: Sequence[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    parser = _parser()
    args = parser.parse_args(argv)
    if args.show:
        results, facts = report.load(args.show)
        print(report.table(results.rows))
        print(
            f"load average at start {facts.get('load_average_at_start')}, "
            f"at end {facts.get('load_average_at_end')}"
        )
        if args.compare:
            _print_compare(args.compare, results)
        return 0
    if args.only == "middleware":
        return _middleware(args, parser)
    if args.only == "fairness":
        args.only = "drain"  # the settings' backends and target; the scenario is fairness's own
        from bench import fairness

        return fairness.run(
            _settings(args, parser),
            big=args.fairness_big,
            keys=args.fairness_keys,
            due=args.fairness_due,
        )
    if args.only == "workflows":
        return _workflows(args, parser)
    if args.only == "backlog":
        args.only = "drain"  # the settings' backends and target; the scenario is backlog's own
        return backlog.run(_settings(args, parser), backlog_jobs=args.backlog_jobs)
    settings = _settings(args, parser)
    facts = environment(list(settings.backends), settings.target)
    facts["settings"] = {
        key: value for key, value in dataclasses.asdict(settings).items() if key != "target"
    }
    facts["load_average_at_start"] = _load()
    cpus = os.cpu_count() or 1
    if facts["load_average_at_start"][0] > cpus:
        print(
            f"warning: load average {facts['load_average_at_start'][0]:.1f} on {cpus} CPUs: "
            "other work is running, expect noisy figures",
            file=sys.stderr,
        )
    if args.memory is not None:
        return _memory(args.memory, settings, facts, args.json)
    if args.peers:
        return _peers(settings, facts, args.json)
    if args.faults:
        return _faults(settings, args.drain_jobs)
    if "mvcc" in settings.scenarios:
        return _mvcc(settings, args, parser)

    runner = Runner(settings)
    loads = []
    started = time.monotonic()
    for run in range(settings.runs):
        for backend in settings.backends:
            runner.measure(run, backend)
        loads.append(_load())
    results = runner.finish()
    facts["load_average_at_end"] = _load()
    facts["load_average_after_each_run"] = loads
    facts["sqlqueue_commit_at_end"] = git_commit()
    facts["seconds"] = round(time.monotonic() - started, 1)

    print()
    print(_header(facts, settings))
    print(report.table(results.rows))
    print(_legend(settings))
    print(
        f"load average (1/5/15 min) at start {facts['load_average_at_start']}, "
        f"at end {facts['load_average_at_end']}; took {facts['seconds']:.0f} s"
    )
    if facts["sqlqueue_commit_at_end"] != facts["sqlqueue_commit"]:
        print(
            f"warning: the code changed during the run ({facts['sqlqueue_commit']} -> "
            f"{facts['sqlqueue_commit_at_end']}); workers started later ran the newer code"
        )
    if args.json:
        report.save(args.json, results, facts, {})
        print(f"wrote {args.json}")
    if args.compare:
        _print_compare(args.compare, results)
    return 0


def _peers(settings: Settings, facts: dict[str, Any], path: Path | None) -> int:
    found = peers.available()
    missing = [peer for peer in peers.PEERS if peer not in found]
    if missing:
        print(
            f"warning: {', '.join(missing)} not installed (pip install -e '.[bench]'): "
            "their columns stay empty",
            file=sys.stderr,
        )
    facts["peers"] = {peer: package_version(peer) for peer in found}
    started = time.monotonic()
    results = side_by_side.measure(settings, found)
    facts["load_average_at_end"] = _load()
    facts["seconds"] = round(time.monotonic() - started, 1)
    print()
    print(_header(facts, settings))
    versions = ", ".join(f"{peer} {version}" for peer, version in facts["peers"].items())
    print(
        f"one worker process each, {settings.drain_jobs:,} queued no-op jobs per drain; "
        f"{versions or 'no peers installed'}"
    )
    print(side_by_side.table(results, settings))
    print(
        "Cells: median of the runs (min-max). Ratios: per run, then the median. Drains: jobs / "
        "(last completion - first claim) on the database clock; raw claims N per statement."
    )
    print(
        f"load average (1/5/15 min) at start {facts['load_average_at_start']}, "
        f"at end {facts['load_average_at_end']}; took {facts['seconds']:.0f} s"
    )
    if path:
        side_by_side.save(path, results, facts)
        print(f"wrote {path}")
    return 0


def _middleware(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    backends = _names(args.backends)
    if not backends or set(backends) - set(BACKENDS):
        parser.error(f"--backends: expected sqlite, postgresql, mysql, got {args.backends!r}")
    load = _load()
    found = middleware.measure(
        backends,
        Target(
            postgres_url=args.postgres_url, sqlite_dir=args.sqlite_dir, mysql_url=args.mysql_url
        ),
        runs=args.runs or (1 if args.quick else 7),
        jobs=args.drain_jobs or (300 if args.quick else 5000),
        concurrency=10,
        handlers=("sync", "async"),
    )
    print()
    print(middleware.table(found, middleware.call_overhead_us()))
    if args.instructions:
        small, big = (50, 150) if args.quick else (50, 450)
        counted = middleware_instructions.measure(
            small=small,
            big=big,
            backends=[name for name in backends if name in ("sqlite", "postgresql")],
            handlers=("sync", "async"),
            target=Target(postgres_url=args.postgres_url, sqlite_dir=args.sqlite_dir),
        )
        print()
        print(middleware_instructions.table(counted))
    print(f"load average (1/5/15 min) at start {load}, at end {_load()}")
    return 0


def _workflows(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    backends = _names(args.backends)
    if not backends or set(backends) - set(BACKENDS):
        parser.error(f"--backends: expected sqlite, postgresql, mysql, got {args.backends!r}")
    load = _load()
    found = workflows.measure(
        backends,
        Target(
            postgres_url=args.postgres_url, sqlite_dir=args.sqlite_dir, mysql_url=args.mysql_url
        ),
        runs=args.runs or (1 if args.quick else 3),
        steps=300 if args.quick else 10_000,
        jobs=args.drain_jobs or (300 if args.quick else 10_000),
        concurrency=10,
    )
    print()
    print(workflows.table(found))
    print(f"load average (1/5/15 min) at start {load}, at end {_load()}")
    return 0


def _mvcc(settings: Settings, args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from bench import mvcc

    try:
        systems = mvcc.systems_of(args.mvcc_systems or ",".join(mvcc.DEFAULT_SYSTEMS))
    except ValueError as error:
        parser.error(f"--mvcc-systems: {error}")
    if args.mvcc_rate < 1 or args.mvcc_minutes <= 0 or args.mvcc_warmup < 0:
        parser.error("--mvcc-rate must be >= 1, --mvcc-minutes > 0, --mvcc-warmup >= 0")
    options = mvcc.MvccOptions(
        systems=systems,
        rate=args.mvcc_rate,
        minutes=args.mvcc_minutes,
        warmup_seconds=args.mvcc_warmup,
        output=args.mvcc_output or mvcc.MvccOptions().output,
    )
    found = mvcc.run(settings, options)
    mvcc.save(found, options.output)
    print(Path(options.output).with_suffix(".md").read_text(encoding="utf-8").split("\n## ")[0])
    print(f"wrote {options.output}.md, .png and .json")
    return 0


def _faults(settings: Settings, drain_jobs: int | None) -> int:
    found = faults.measure(
        settings, rates=sorted(faults.TARGETS), jobs=drain_jobs or 800, processes=2, concurrency=10
    )
    print()
    print(faults.table(found))
    return 0


def _memory(jobs: int, settings: Settings, facts: dict[str, Any], path: Path | None) -> int:
    found = []
    for backend in settings.backends:
        result = memory.measure(backend=backend, jobs=jobs, settings=settings)
        found.append(result)
        print(memory.describe(result), flush=True)
    facts["load_average_at_end"] = _load()
    print(
        f"load average (1/5/15 min) at start {facts['load_average_at_start']}, "
        f"at end {facts['load_average_at_end']}"
    )
    if path:
        extra = {"memory": [result.as_dict() for result in found]}
        report.save(path, report.Results(), facts, extra)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
