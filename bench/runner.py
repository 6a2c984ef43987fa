"""One run of the suite on one backend: each scenario measured for sqlqueue and raw SQL.

Scenarios: enqueue one job per transaction, bulk enqueue, drains (processes x concurrency),
the many-workers drain (PostgreSQL), pickup latency and idle CPU. Each sqlqueue figure is
measured back to back with the same operation as raw SQL with the same driver; which engine
goes first alternates between runs. See bench/README.md for what each figure means.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable, Sequence

from bench import drain, enqueue, idle, pickup
from bench.databases import fresh_database
from bench.names import NOOP, NOOP_ASYNC
from bench.report import Results
from bench.settings import Settings

__all__ = ["ENGINES", "Runner"]

ENGINES = ("sqlqueue", "raw")


def _progress(run: int, settings: Settings, backend: str, label: str, text: str) -> None:
    print(
        f"run {run + 1}/{settings.runs} {backend:<10} {label:<34} {text}",
        file=sys.stderr,
        flush=True,
    )


def _order(run: int) -> tuple[str, ...]:
    """Alternate which engine goes first, so neither always gets the warmer machine."""
    return ENGINES if run % 2 == 0 else ENGINES[::-1]


class Runner:
    """Measures each scenario of one run on one backend and files the figures."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.results = Results()
        #: (backend, row key) -> engine -> every run's drain, for the notes column.
        self.drains: dict[tuple[str, str], dict[str, list[drain.Drain]]] = {}
        #: backend -> engine -> most connections an idle (long-running) worker held.
        self.idle_connections: dict[str, dict[str, int]] = {}

    def measure(self, run: int, backend: str) -> None:
        s = self.settings
        if "enqueue" in s.scenarios:
            self._throughput(
                run,
                backend,
                f"enqueue.one.{s.enqueue_jobs}",
                "enqueue, 1 job per transaction",
                {"sqlqueue": enqueue.one_by_one_sqlqueue, "raw": enqueue.one_by_one_raw},
                s.enqueue_jobs,
            )
            self._throughput(
                run,
                backend,
                f"enqueue.engine.{s.enqueue_jobs}",
                "enqueue, 1 job, Engine form",
                {"sqlqueue": enqueue.one_by_one_sqlqueue_engine, "raw": enqueue.one_by_one_raw},
                s.enqueue_jobs,
            )
        if "bulk" in s.scenarios:
            self._bulk(run, backend)
        if "drain" in s.scenarios:
            self._drains(run, backend, s.drains, s.raw_batch)
            if s.async_drains:
                self._drains(run, backend, s.async_drains, s.raw_batch, job_type=NOOP_ASYNC)
        if "many" in s.scenarios and backend == "postgresql" and s.many_processes:
            self._drains(run, backend, ((s.many_processes, s.many_concurrency),), s.raw_batch)
        if "pickup" in s.scenarios:
            self._pickup(run, backend)
        if "idle" in s.scenarios:
            self._idle(run, backend)

    def _throughput(
        self,
        run: int,
        backend: str,
        key: str,
        label: str,
        measures: dict[str, Callable[[str, int], float]],
        jobs: int,
    ) -> dict[str, float]:
        row = self.results.row(backend, key, label, "jobs/s", higher_is_better=True)
        values: dict[str, float] = {}
        for engine in _order(run):
            with fresh_database(backend, self.settings.target) as url:
                values[engine] = measures[engine](url, jobs)
            _progress(run, self.settings, backend, label, f"{engine:<8} {values[engine]:>9,.0f}")
        row.add("sqlqueue", values["sqlqueue"])
        row.add("raw", values["raw"])
        return values

    def _bulk(self, run: int, backend: str) -> None:
        jobs = self.settings.bulk_jobs
        label = f"enqueue_many, {jobs:,} in one call"
        values = self._throughput(
            run,
            backend,
            f"enqueue.bulk.{jobs}",
            label,
            {"sqlqueue": enqueue.bulk_sqlqueue, "raw": enqueue.bulk_raw},
            jobs,
        )
        if backend != "postgresql":
            return
        # The same sqlqueue figure against COPY, the fastest way into PostgreSQL.
        with fresh_database(backend, self.settings.target) as url:
            copy = enqueue.copy_raw(url, jobs)
        label = f"enqueue_many, {jobs:,}, vs raw COPY"
        _progress(run, self.settings, backend, label, f"{'raw COPY':<8} {copy:>9,.0f}")
        row = self.results.row(
            backend, f"enqueue.bulk_vs_copy.{jobs}", label, "jobs/s", higher_is_better=True
        )
        row.add("sqlqueue", values["sqlqueue"])
        row.add("raw", copy)
        row.notes[:] = ["raw = COPY FROM STDIN, no ids back"]

    def _drains(
        self,
        run: int,
        backend: str,
        configs: Sequence[tuple[int, int]],
        raw_batch: int,
        *,
        job_type: str = NOOP,
    ) -> None:
        jobs = self.settings.drain_jobs
        raw_by_processes: dict[int, drain.Drain] = {}
        plan = [("raw", p, raw_batch) for p in sorted({p for p, _ in configs})]
        plan += [("sqlqueue", p, c) for p, c in configs]
        if run % 2:
            plan.reverse()
        sqlqueue_drains: dict[tuple[int, int], drain.Drain] = {}
        for engine, processes, concurrency in plan:
            result = drain.measure(
                backend=backend,
                engine=engine,
                process_count=processes,
                concurrency=concurrency,
                jobs=jobs,
                settings=self.settings,
                job_type=job_type,
            )
            handler = " async" if job_type == NOOP_ASYNC else ""
            label = f"drain {processes}x{concurrency}{handler}" if engine == "sqlqueue" else "drain"
            _progress(
                run,
                self.settings,
                backend,
                f"{label} ({processes} proc)",
                f"{engine:<8} {result.jobs_per_second:>9,.0f} "
                f"({result.window_seconds:.2f} s window)",
            )
            if engine == "raw":
                raw_by_processes[processes] = result
            else:
                sqlqueue_drains[(processes, concurrency)] = result
        for (processes, concurrency), result in sqlqueue_drains.items():
            raw = raw_by_processes[processes]
            key = f"drain.{jobs}.p{processes}c{concurrency}"
            procs = "proc" if processes == 1 else "procs"
            described = f"drain {jobs:,}, {processes} {procs} x concurrency {concurrency}"
            if job_type == NOOP_ASYNC:
                key += ".async"
                described += ", async"
            row = self.results.row(
                backend,
                key,
                described,
                "jobs/s",
                higher_is_better=True,
            )
            row.add("sqlqueue", result.jobs_per_second, result.details())
            row.add("raw", raw.jobs_per_second, raw.details())
            kept = self.drains.setdefault((backend, key), {"sqlqueue": [], "raw": []})
            kept["sqlqueue"].append(result)
            kept["raw"].append(raw)

    def _pickup(self, run: int, backend: str) -> None:
        s = self.settings
        found: dict[str, dict[int, float]] = {}
        latencies: dict[str, list[float]] = {}
        for engine in _order(run):
            latencies[engine] = pickup.measure(backend=backend, engine=engine, settings=s)
            found[engine] = pickup.percentiles(latencies[engine])
            text = " ".join(f"p{p} {ms:.1f}" for p, ms in found[engine].items())
            _progress(run, s, backend, "pickup latency (ms)", f"{engine:<8} {text}")
        for p in pickup.PERCENTILES:
            row = self.results.row(
                backend,
                f"pickup.{s.poll_interval:g}.p{p}",
                f"pickup latency p{p} (poll {s.poll_interval:g} s)",
                "ms",
                higher_is_better=False,
            )
            for engine in ENGINES:
                # Every latency is kept once, with the p50 row.
                kept = [round(ms, 3) for ms in latencies[engine]] if p == 50 else None
                row.add(engine, found[engine][p], kept)

    def _idle(self, run: int, backend: str) -> None:
        s = self.settings
        found = idle.measure(backend=backend, settings=s)
        cpu = found.cpu_percent
        text = ", ".join(f"{engine} {cpu[engine]:.2f}" for engine in ENGINES)
        _progress(run, s, backend, f"idle worker CPU over {s.idle_seconds:g} s", text)
        row = self.results.row(
            backend,
            f"idle.{s.poll_interval:g}.cpu",
            f"idle worker CPU (poll {s.poll_interval:g} s)",
            "% CPU",
            higher_is_better=False,
        )
        held = found.connections
        row.add("sqlqueue", cpu["sqlqueue"], {"connections": held.get("sqlqueue")})
        row.add("raw", cpu["raw"], {"connections": held.get("raw")})
        if held:
            most = self.idle_connections.setdefault(backend, {})
            for engine, count in held.items():
                most[engine] = max(most.get(engine, 0), count)
            row.notes[:] = [f"sqlqueue|raw: conns/proc {most['sqlqueue']}|{most['raw']}"]

    def finish(self) -> Results:
        """The results, with each drain row's notes: connections, transactions and CPU per job."""
        for row in self.results.rows:
            kept = self.drains.get((row.backend, row.key))
            if kept:
                row.notes[:] = [_drain_notes(kept["sqlqueue"], kept["raw"])]
        return self.results


def _drain_notes(sqlqueue: Sequence[drain.Drain], raw: Sequence[drain.Drain]) -> str:
    """``sqlqueue|raw``: most connections per process, median transactions and CPU per job."""

    def most_connections(drains: Sequence[drain.Drain]) -> str:
        seen = [d.max_connections_per_process for d in drains]
        return str(max(n for n in seen if n is not None)) if any(seen) else "?"

    def median(values: Sequence[float | None], digits: int) -> str:
        known = [v for v in values if v is not None]
        return f"{statistics.median(known):.{digits}f}" if known else "?"

    parts = []
    if any(d.connections for d in sqlqueue):
        parts.append(f"conns/proc {most_connections(sqlqueue)}|{most_connections(raw)}")
        tx = [median([d.transactions_per_job for d in ds], 3) for ds in (sqlqueue, raw)]
        parts.append(f"tx/job {tx[0]}|{tx[1]}")
    cpu = [median([d.worker_cpu_ms_per_job for d in ds], 3) for ds in (sqlqueue, raw)]
    parts.append(f"worker CPU ms/job {cpu[0]}|{cpu[1]}")
    return "sqlqueue|raw: " + ", ".join(parts)
