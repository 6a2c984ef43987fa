"""The fault suite's harness: worker processes with hooks, and counting from the ledger.

A :class:`Faults` object belongs to one test on one database. It starts
``python -m tests.apps.fault_worker`` children (killed if still running at the end), enqueues
``fault.*`` jobs, reads the ledger, the audit of job transitions and the job rows, and prints
the test's figure. The verdicts (:func:`tally`, :func:`history_problems`) are computed from
those rows only; worker logs are quoted when something fails, and grepped only where the
promise itself is about what gets logged.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest
import sqlalchemy as sa

import sqlqueue
from sqlqueue.dialects import dialect_for
from tests._support import forkserver
from tests.apps.fault_ledger import (
    Execution,
    LeaseChange,
    Transition,
    create_fault_tables,
    create_lease_audit,
    read_lease_changes,
    read_ledger,
    read_transitions,
)
from tests.apps.fault_tasks import register_fault_tasks
from tests.apps.processes import REPO_ROOT, child_env, wait_until
from tests.conftest import Backend

__all__ = [
    "FaultWorker",
    "Faults",
    "Tally",
    "history_problems",
    "percentile",
    "reaps",
    "reaps_of_live_leases",
    "tally",
]

TERMINAL = {"succeeded", "dead", "cancelled"}


def percentile(values: Sequence[float], fraction: float) -> float:
    """The ``fraction`` quantile of ``values`` (nearest rank); 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(fraction * len(ordered) + 0.5) - 1))
    return ordered[index]


class FaultWorker:
    """One ``python -m tests.apps.fault_worker`` child, its output in a log file: forked from
    the fork server, or exec'd when its clock is to be skewed (``FAULT_CLOCK_SKEW_SECONDS``):
    the skew goes in before sqlqueue is imported, and a fork of the server has it imported."""

    def __init__(self, args: Sequence[str], env: dict[str, str], log_path: Path) -> None:
        self.log_path = log_path
        self._log: IO[bytes] = log_path.open("wb")
        self.popen: forkserver.Process = forkserver.spawn(
            [sys.executable, "-m", "tests.apps.fault_worker", *args],
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            fresh=bool(env.get("FAULT_CLOCK_SKEW_SECONDS")),
        )

    @property
    def pid(self) -> int:
        """The child's process id."""
        return self.popen.pid

    @property
    def alive(self) -> bool:
        """Whether the process is still running."""
        return self.popen.poll() is None

    def log(self) -> str:
        """What the worker has printed and logged so far."""
        return self.log_path.read_text(errors="replace")

    def describe(self) -> str:
        """Exit status and log tail, for assertion messages."""
        tail = "\n".join(self.log().splitlines()[-30:])
        return f"worker pid {self.pid} (exit {self.popen.poll()}) log tail:\n{tail}"

    def ready(self) -> bool:
        """Whether the worker serves (failing at once if it died during start-up)."""
        if not self.alive:
            raise AssertionError(f"the worker exited during start-up\n{self.describe()}")
        return "serving queues" in self.log()

    def send(self, sig: signal.Signals) -> None:
        """Send ``sig`` to the worker."""
        self.popen.send_signal(sig)

    def wait(self, timeout: float) -> int:
        """Wait for the worker to exit; fail (and kill it) after ``timeout`` seconds."""
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(timeout=10)
            raise AssertionError(f"no exit within {timeout:g} s\n{self.describe()}") from None

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM the worker and return its exit status."""
        self.send(signal.SIGTERM)
        return self.wait(timeout)

    def close(self) -> None:
        """Kill the worker if it still runs (resuming it first if stopped); close its log."""
        if self.alive:
            self.popen.send_signal(signal.SIGCONT)
            self.popen.kill()
            self.popen.wait(timeout=10)
        self._log.close()


@dataclass(frozen=True, kw_only=True)
class Tally:
    """What the ledger says about a set of jobs."""

    jobs: int
    executions: int
    #: Jobs without a finished execution.
    lost: tuple[int, ...]
    #: Jobs that ran more than once (any two executions, finished or not).
    duplicates: tuple[int, ...]
    #: Jobs with two executions running at the same time.
    overlaps: tuple[int, ...]
    #: Executions per job: (fewest, most).
    spread: tuple[int, int]

    def line(self) -> str:
        """The tally as a figure."""
        return (
            f"jobs {self.jobs}, executions {self.executions} (per job {self.spread[0]}.."
            f"{self.spread[1]}), lost {len(self.lost)}, duplicates {len(self.duplicates)}, "
            f"overlaps {len(self.overlaps)}"
        )


def tally(
    job_ids: Iterable[int],
    executions: Sequence[Execution],
    *,
    ended: Mapping[int, float] | None = None,
) -> Tally:
    """Count losses, duplicates and overlaps of ``job_ids`` from their executions.

    An unfinished execution ended when its process died (``ended[pid]``), or is still going.
    """
    ids = list(job_ids)
    runs: dict[int, list[Execution]] = defaultdict(list)
    for execution in executions:
        runs[execution.job_id].append(execution)
    ended = ended or {}
    lost, duplicates, overlaps = [], [], []
    for job_id in ids:
        mine = sorted(runs.get(job_id, []), key=lambda e: e.started)
        if not any(e.finished is not None for e in mine):
            lost.append(job_id)
        if len(mine) > 1:
            duplicates.append(job_id)
        end = float("-inf")
        for execution in mine:
            if execution.started < end:
                overlaps.append(job_id)
                break
            end = max(end, _end_of(execution, ended))
    counts = [len(runs.get(job_id, [])) for job_id in ids] or [0]
    return Tally(
        jobs=len(ids),
        executions=sum(counts),
        lost=tuple(lost),
        duplicates=tuple(duplicates),
        overlaps=tuple(overlaps),
        spread=(min(counts), max(counts)),
    )


def _end_of(execution: Execution, ended: Mapping[int, float]) -> float:
    if execution.finished is not None:
        return execution.finished
    return ended.get(execution.pid, float("inf"))


def history_problems(transitions: Sequence[Transition]) -> list[str]:
    """Every audited transition that breaks the state machine's promises.

    A move to ``running`` (a claim) starts from ``queued`` or ``failed`` and adds exactly one
    attempt; every move out of ``running`` (success, failure, dead, release) starts from
    ``running``; nothing ever leaves a terminal state, so no job is both succeeded and failed.
    """
    problems: list[str] = []
    by_job: dict[int, list[Transition]] = defaultdict(list)
    for transition in transitions:
        by_job[transition.job_id].append(transition)
    for job_id, history in by_job.items():
        path = " -> ".join(f"{t.old_status}>{t.new_status}#{t.attempts}" for t in history)
        previous_attempts: int | None = None
        for t in history:
            if t.old_status in TERMINAL:
                problems.append(f"job {job_id} left {t.old_status}: {path}")
            elif t.new_status == "running":
                if t.old_status not in {"queued", "failed"}:
                    problems.append(f"job {job_id} claimed while {t.old_status}: {path}")
                elif previous_attempts is not None and t.attempts != previous_attempts + 1:
                    problems.append(f"job {job_id} claim skipped or repeated an attempt: {path}")
            elif t.new_status in {"succeeded", "failed", "dead", "queued"} and (
                t.old_status != "running"
            ):
                problems.append(f"job {job_id} {t.old_status}>{t.new_status}: {path}")
            previous_attempts = t.attempts
    return problems


def reaps(changes: Sequence[LeaseChange]) -> list[LeaseChange]:
    """The lease changes that took a job from ``running`` to ``failed`` or ``dead``. With
    handlers that never fail (``fault.sleep``, ``fault.gated``) each is the reaper's."""
    return [c for c in changes if c.old_status == "running" and c.new_status in {"failed", "dead"}]


def reaps_of_live_leases(changes: Sequence[LeaseChange]) -> list[str]:
    """Every reap made while the lease it took had not expired by the database's clock of the
    reaping statement: "a live job is never reaped", as the database saw it."""
    return [
        f"job {c.job_id} attempt {c.attempts} reaped at {c.at:.6f} from {c.locked_by}, its "
        f"lease running until {c.old_lease:.6f}"
        for c in reaps(changes)
        if c.old_lease is None or c.old_lease >= c.at
    ]


class Faults:
    """One fault test's database, worker processes, enqueues, counts and figures."""

    def __init__(
        self,
        backend: Backend,
        tmp_path: Path,
        size: int,
        capsys: pytest.CaptureFixture[str],
        name: str,
    ) -> None:
        self.backend = backend
        self.engine = backend.engine
        self.tmp_path = tmp_path
        self.size = size
        self._capsys = capsys
        self._name = name
        create_fault_tables(self.engine)
        self.queue = backend.queue()
        register_fault_tasks(self.queue)
        self.engine.dispose()  # pooled connections predate the queue's connection settings
        self.workers: list[FaultWorker] = []

    # -- processes --------------------------------------------------------------------------

    def start(
        self,
        *,
        concurrency: int = 4,
        poll: float = 0.05,
        lease: float = 30.0,
        shutdown_timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        url: str | None = None,
        queues: Sequence[str] = (),
    ) -> FaultWorker:
        """Start one worker process (not waiting for it to serve)."""
        args = ["--concurrency", str(concurrency), "--poll-interval", str(poll)]
        if queues:
            args += ["--queues", ",".join(queues)]
        if shutdown_timeout is not None:
            args += ["--shutdown-timeout", str(shutdown_timeout)]
        extra = {"FAULT_LEASE_SECONDS": str(lease), "FAULT_LEDGER_URL": self.backend.url}
        extra.update(env or {})
        log_path = self.tmp_path / f"worker-{len(self.workers) + 1}.log"
        worker = FaultWorker(args, child_env(url or self.backend.url, **extra), log_path)
        self.workers.append(worker)
        return worker

    def start_many(self, count: int, **options: Any) -> list[FaultWorker]:
        """Start ``count`` workers and wait until every one serves."""
        started = [self.start(**options) for _ in range(count)]
        self.wait_ready(started)
        return started

    def wait_ready(self, workers: Sequence[FaultWorker], timeout: float = 60.0) -> None:
        """Wait until ``workers`` all serve."""
        wait_until(
            lambda: all(worker.ready() for worker in workers),
            timeout=timeout,
            what=f"{len(workers)} worker(s) to start",
            interval=0.05,
            explain=lambda: "\n".join(w.describe() for w in workers),
        )

    def stop_all(self, workers: Sequence[FaultWorker] | None = None) -> None:
        """SIGTERM every live worker at once; each must exit 0. A worker still starting (a
        respawn on a loaded machine) is waited for first: before it serves, SIGTERM's default
        action kills it (exit -15), which tests nothing of its graceful stop."""
        live = [w for w in (workers or self.workers) if w.alive]
        self.wait_ready(live)
        for worker in live:
            worker.send(signal.SIGTERM)
        for worker in live:
            assert worker.wait(60) == 0, worker.describe()

    def explain(self) -> str:
        """Every worker's log tail."""
        return "\n".join(worker.describe() for worker in self.workers)

    def close(self) -> None:
        """Kill what still runs."""
        for worker in self.workers:
            worker.close()

    # -- jobs -------------------------------------------------------------------------------

    def enqueue(
        self, job_type: str, payloads: Sequence[Mapping[str, Any]], **options: Any
    ) -> list[int]:
        """Enqueue one job per payload in one committed transaction; return their ids."""
        requests = [
            sqlqueue.JobRequest(job_type=job_type, payload=payload, **options)
            for payload in payloads
        ]
        return self.enqueue_requests(requests)

    def enqueue_requests(self, requests: Sequence[sqlqueue.JobRequest]) -> list[int]:
        """Enqueue ``requests`` in one committed transaction."""
        with self.engine.begin() as conn:
            return self.queue.enqueue_many(conn, list(requests))

    def count(self, *statuses: str) -> int:
        """How many jobs are in any of ``statuses``."""
        query = sa.text("SELECT count(*) FROM sqlqueue_jobs WHERE status IN :statuses")
        query = query.bindparams(sa.bindparam("statuses", expanding=True))
        with self.engine.connect() as conn:
            return int(conn.execute(query, {"statuses": list(statuses)}).scalar_one())

    def wait_for(
        self, count: int, *statuses: str, timeout: float, what: str | None = None
    ) -> float:
        """Wait until ``count`` jobs are in ``statuses``; return the seconds it took."""
        began = time.monotonic()
        wait_until(
            lambda: self.count(*statuses) >= count,
            timeout=timeout,
            what=what or f"{count} jobs {'/'.join(statuses)}",
            interval=0.1,
            explain=lambda: f"{self.count(*statuses)} are\n{self.explain()}",
        )
        return time.monotonic() - began

    def wait_until_started(self, executions: int, timeout: float = 30.0) -> None:
        """Wait until the ledger holds ``executions`` rows."""
        wait_until(
            lambda: len(self.ledger()) >= executions,
            timeout=timeout,
            what=f"{executions} executions to start",
            explain=self.explain,
        )

    def jobs(self) -> dict[int, sqlqueue.Job]:
        """Every job, by id."""
        with self.engine.connect() as conn:
            ids = list(conn.execute(sa.text("SELECT id FROM sqlqueue_jobs")).scalars())
        found = {job_id: self.queue.get_job(job_id) for job_id in ids}
        return {job_id: job for job_id, job in found.items() if job is not None}

    def describe_jobs(self, job_ids: Iterable[int], limit: int = 5) -> str:
        """The ledger rows and audited transitions of some jobs, for assertion messages."""
        wanted = set(list(job_ids)[:limit])
        lines = [f"jobs {sorted(wanted)}:"]
        lines += [f"  ran {e}" for e in self.ledger() if e.job_id in wanted]
        lines += [f"  moved {t}" for t in self.transitions() if t.job_id in wanted]
        return "\n".join(lines)

    def ledger(self) -> list[Execution]:
        """Every handler execution so far."""
        return read_ledger(self.engine)

    def transitions(self) -> list[Transition]:
        """Every audited job transition so far."""
        return read_transitions(self.engine)

    def audit_leases(self) -> None:
        """Record every lease change from now on (:meth:`lease_changes`)."""
        create_lease_audit(self.engine)

    def lease_changes(self) -> list[LeaseChange]:
        """Every audited lease change so far (after :meth:`audit_leases`)."""
        return read_lease_changes(self.engine)

    def db_now(self) -> float:
        """The database clock now, as epoch seconds (the audit's time base)."""
        with self.engine.connect() as conn:
            value = conn.execute(sa.select(dialect_for(self.engine).clock())).scalar_one()
        return float(value.timestamp())

    # -- figures ----------------------------------------------------------------------------

    def figure(self, text: str, **numbers: Any) -> None:
        """Print the test's measured figure (and append it to ``$FAULT_FIGURES`` as JSON)."""
        label = f"[{self._name} {self.backend.name} x{self.size}]"
        with self._capsys.disabled():
            print(f"\n    {label} {text}")
        path = os.environ.get("FAULT_FIGURES")
        if path:
            record = {
                "test": self._name,
                "backend": self.backend.name,
                "size": self.size,
                "text": text,
                **numbers,
            }
            with open(path, "a", encoding="utf-8") as out:
                out.write(json.dumps(record) + "\n")


def poll(probe: Callable[[], bool], *, timeout: float, what: str) -> None:
    """:func:`wait_until` for boolean probes."""
    wait_until(probe, timeout=timeout, what=what, interval=0.05)
