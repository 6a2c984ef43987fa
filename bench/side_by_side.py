"""``python -m bench --peers``: sqlqueue next to pgqueuer, procrastinate and raw SQL, one run.

PostgreSQL only (the peers are PostgreSQL queues). Every figure is measured in the same run,
each on a fresh database, and which engine goes first rotates between runs:

- drains of ``drain_jobs`` no-op jobs by **one worker process** at each jobs-in-flight size N:
  raw SQL claiming N per statement (``bench.raw_worker --batch N``), pgqueuer with
  ``batch_size=N``, procrastinate with ``concurrency=N``, sqlqueue with ``--concurrency N`` and
  an async no-op handler (the peers' handlers are async too); then sqlqueue with a sync
  handler and with two processes, for the two-processes-vs-one ratio;
- enqueue one job per transaction, and in bulk;
- pickup latency into an idle worker.

Ratios are taken per run (engines measured back to back), then their median is shown.
``--only`` narrows the run to some of its scenarios (``drain``, ``enqueue``, ``bulk``,
``pickup``): ``python -m bench --peers --only drain --in-flight 100`` is the drain at 100 in
flight alone.
bench/README.md ("Peers") says what each engine runs.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench import drain, enqueue, peers, pickup
from bench.databases import fresh_database
from bench.names import NOOP, NOOP_ASYNC
from bench.settings import Settings

__all__ = ["ENGINES", "PeerResults", "measure", "table"]

ENGINES = ("raw", "pgqueuer", "procrastinate", "sqlqueue")


@dataclasses.dataclass
class PeerResults:
    """Every run's figure per (row, engine), and worker CPU ms/job per drain."""

    values: dict[str, dict[str, list[float]]] = dataclasses.field(default_factory=dict)
    cpu: dict[str, dict[str, list[float]]] = dataclasses.field(default_factory=dict)
    transactions: dict[str, dict[str, list[float]]] = dataclasses.field(default_factory=dict)

    def add(self, row: str, engine: str, value: float) -> None:
        self.values.setdefault(row, {}).setdefault(engine, []).append(value)

    def add_drain(self, row: str, engine: str, result: drain.Drain) -> None:
        self.add(row, engine, result.jobs_per_second)
        self.cpu.setdefault(row, {}).setdefault(engine, []).append(result.worker_cpu_ms_per_job)
        if result.transactions_per_job is not None:
            kept = self.transactions.setdefault(row, {}).setdefault(engine, [])
            kept.append(result.transactions_per_job)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _progress(run: int, settings: Settings, label: str, engine: str, text: str) -> None:
    print(
        f"run {run + 1}/{settings.runs} peers {label:<30} {engine:<16} {text}",
        file=sys.stderr,
        flush=True,
    )


def _rotated(engines: Sequence[str], run: int) -> list[str]:
    """Rotate which engine goes first, so none always gets the warmer (or busier) machine."""
    shift = run % len(engines)
    return [*engines[shift:], *engines[:shift]]


def _drain(engine: str, in_flight: int, settings: Settings, *, processes: int = 1) -> drain.Drain:
    jobs = settings.drain_jobs
    if engine in peers.PEERS:
        return peers.drain_measure(engine, in_flight=in_flight, jobs=jobs, settings=settings)
    job_type = NOOP if engine == "sqlqueue-sync" else NOOP_ASYNC
    return drain.measure(
        backend="postgresql",
        engine="raw" if engine == "raw" else "sqlqueue",
        process_count=processes,
        concurrency=in_flight,
        jobs=jobs,
        # Raw SQL claims as many per statement as the others hold in flight.
        settings=dataclasses.replace(settings, raw_batch=in_flight),
        job_type=job_type,
    )


def _ours(
    measure: Callable[[str, int], float], settings: Settings, jobs: int
) -> Callable[[], float]:
    def run() -> float:
        with fresh_database("postgresql", settings.target) as url:
            return measure(url, jobs)

    return run


def measure(settings: Settings, available: Sequence[str]) -> PeerResults:
    """Every run of every row, for raw, sqlqueue and the ``available`` peers."""
    results = PeerResults()
    engines = [e for e in ENGINES if e not in peers.PEERS or e in available]
    wanted = set(settings.scenarios)
    for run in range(settings.runs):
        for in_flight in settings.peer_in_flight if "drain" in wanted else ():
            row = f"drain.{in_flight}"
            for engine in _rotated([*engines, "sqlqueue-sync", "sqlqueue-2"], run):
                processes = 2 if engine == "sqlqueue-2" else 1
                name = "sqlqueue" if engine == "sqlqueue-2" else engine
                result = _drain(name, in_flight, settings, processes=processes)
                results.add_drain(row, engine, result)
                _progress(
                    run,
                    settings,
                    f"drain, {in_flight} in flight",
                    engine,
                    f"{result.jobs_per_second:>9,.0f} jobs/s, "
                    f"{result.worker_cpu_ms_per_job:.3f} CPU ms/job",
                )
        measures: dict[str, dict[str, Callable[[], float]]] = {}
        if "enqueue" in wanted:
            measures["enqueue.one"] = {
                "raw": _ours(enqueue.one_by_one_raw, settings, settings.enqueue_jobs),
                "sqlqueue": _ours(enqueue.one_by_one_sqlqueue, settings, settings.enqueue_jobs),
            }
            for peer in available:
                measures["enqueue.one"][peer] = _peer_call(peers.one_by_one, peer, settings, True)
        if "bulk" in wanted:
            measures["enqueue.bulk"] = {
                "raw": _ours(enqueue.bulk_raw, settings, settings.bulk_jobs),
                "sqlqueue": _ours(enqueue.bulk_sqlqueue, settings, settings.bulk_jobs),
            }
            for peer in available:
                measures["enqueue.bulk"][peer] = _peer_call(peers.bulk, peer, settings, False)
        for row, by_engine in measures.items():
            for engine in _rotated(engines, run):
                value = by_engine[engine]()
                results.add(row, engine, value)
                _progress(run, settings, row, engine, f"{value:>9,.0f} jobs/s")
        for engine in _rotated(engines, run) if "pickup" in wanted else ():
            if engine in peers.PEERS:
                latencies = peers.pickup_measure(engine, settings=settings)
            else:
                latencies = pickup.measure(backend="postgresql", engine=engine, settings=settings)
            found = pickup.percentiles(latencies)
            for p in (50, 99):
                results.add(f"pickup.p{p}", engine, found[p])
            _progress(
                run, settings, "pickup", engine, f"p50 {found[50]:.1f} p99 {found[99]:.1f} ms"
            )
    return results


def _peer_call(
    call: Callable[[str, Settings, int], float], peer: str, settings: Settings, one: bool
) -> Callable[[], float]:
    jobs = settings.enqueue_jobs if one else settings.bulk_jobs
    return lambda: call(peer, settings, jobs)


# -- the table -------------------------------------------------------------------------------


def _median(values: Sequence[float] | None) -> float | None:
    return statistics.median(values) if values else None


def _ratio(results: PeerResults, row: str, top: str, bottom: str) -> float | None:
    """Median over runs of ``top / bottom`` measured in the same run."""
    found = results.values.get(row, {})
    pairs = zip(found.get(top, []), found.get(bottom, []), strict=False)
    return _median([a / b for a, b in pairs if b > 0])


def _cell(values: Sequence[float] | None, unit: str) -> str:
    if not values:
        return "-"
    digits = ".2f" if unit == "ms" else ",.0f"
    spread = f" ({min(values):{digits}}-{max(values):{digits}})" if len(values) > 1 else ""
    return f"{statistics.median(values):{digits}}{spread}"


def _number(value: float | None, digits: str = ".2f") -> str:
    if value is None:
        return "-"
    if digits == ".2f" and value < 0.1:
        digits = ".3f"  # a pickup ratio against a poll loop is small; keep its digits
    return f"{value:{digits}}"


def _rows(settings: Settings) -> list[tuple[str, str, str]]:
    """The rows of the scenarios measured (``--only`` narrows ``--peers`` to some)."""
    wanted = set(settings.scenarios)
    rows = []
    if "drain" in wanted:
        rows += [
            (f"drain.{n}", f"{n} in flight (jobs/s)", "jobs/s") for n in settings.peer_in_flight
        ]
    if "enqueue" in wanted:
        rows += [
            ("enqueue.one", f"enqueue, 1 per transaction ({settings.enqueue_jobs:,}; jobs/s)", "/s")
        ]
    if "bulk" in wanted:
        rows += [
            ("enqueue.bulk", f"enqueue in bulk ({settings.bulk_jobs:,} in one call; jobs/s)", "/s")
        ]
    if "pickup" in wanted:
        rows += [
            ("pickup.p50", "pickup latency p50 (ms)", "ms"),
            ("pickup.p99", "pickup latency p99 (ms)", "ms"),
        ]
    return rows


def table(results: PeerResults, settings: Settings) -> str:
    """The side-by-side table (Markdown), then sqlqueue's variants and CPU per job."""
    lines = [
        "| jobs in flight | raw SQL | pgqueuer | procrastinate | sqlqueue | sqlqueue / raw "
        "| sqlqueue / pgqueuer |",
        "|---|---|---|---|---|---|---|",
    ]
    for key, label, unit in _rows(settings):
        found = results.values.get(key, {})
        cells = [_cell(found.get(engine), unit) for engine in ENGINES]
        ratios = [_ratio(results, key, "sqlqueue", other) for other in ("raw", "pgqueuer")]
        lines.append(f"| {label} | {' | '.join(cells)} | {' | '.join(map(_number, ratios))} |")
    lines += [
        "",
        "| jobs in flight | sqlqueue async, 1 proc | sync handler, 1 proc | async, 2 procs "
        "| 2 procs / 1 | worker CPU ms/job: raw / pgqueuer / procrastinate / sqlqueue "
        "| tx/job: raw / pgqueuer / procrastinate / sqlqueue |",
        "|---|---|---|---|---|---|---|",
    ]
    variants = ("sqlqueue", "sqlqueue-sync", "sqlqueue-2")
    for n in settings.peer_in_flight if "drain" in settings.scenarios else ():
        key = f"drain.{n}"
        found = results.values.get(key, {})
        cpu = results.cpu.get(key, {})
        tx = results.transactions.get(key, {})
        lines.append(
            f"| {n} | {' | '.join(_cell(found.get(e), '/s') for e in variants)} "
            f"| {_number(_ratio(results, key, 'sqlqueue-2', 'sqlqueue'))} "
            f"| {' / '.join(_number(_median(cpu.get(e)), '.3f') for e in ENGINES)} "
            f"| {' / '.join(_number(_median(tx.get(e)), '.3f') for e in ENGINES)} |"
        )
    return "\n".join(lines)


def save(path: Path, results: PeerResults, facts: dict[str, Any]) -> None:
    """Every run's figures and the run's facts, as JSON."""
    path.write_text(json.dumps({"facts": facts, "peers": results.as_dict()}, indent=2, default=str))
