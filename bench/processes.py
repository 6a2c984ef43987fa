"""Worker processes for the benchmark: start them, watch them, read their CPU and memory.

Every kind of worker is a real process started with the current interpreter from the
repository root: ``python -m sqlqueue worker bench.app:queue``, ``python -m bench.raw_worker``
and, for ``--peers``, ``python -m bench.peer_worker PEER``. Each gets its own PostgreSQL
``application_name`` (through libpq's ``PGAPPNAME``) so its connections can be counted in
``pg_stat_activity``. CPU time and RSS come from ``/proc``.
"""

from __future__ import annotations

import os
import resource
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.databases import ROOT
from bench.names import APP, RECORD_VARIABLE
from bench.raw_worker import READY

__all__ = [
    "APP_PREFIX",
    "Worker",
    "children_cpu_seconds",
    "cpu_seconds",
    "peer_command",
    "raw_command",
    "rss_bytes",
    "sqlqueue_command",
    "start",
    "stop_all",
]

#: Every benchmark worker's ``application_name`` starts with this.
APP_PREFIX = "sqlqueue-bench-"
#: What a sqlqueue worker logs (at INFO) just before its first claim.
SQLQUEUE_READY = "serving queues"
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True, kw_only=True)
class Worker:
    """A started worker process, its name (``application_name``) and its stderr log."""

    name: str
    engine: str
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_text(self) -> str:
        try:
            return self.log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def is_ready(self) -> bool:
        """Whether it has said it is about to claim (it may be blocked in that claim)."""
        marker = SQLQUEUE_READY if self.engine == "sqlqueue" else READY
        return marker in self.log_text()

    def check_alive(self) -> None:
        """Stop the benchmark with the worker's log if it died or raised (no-op jobs never do)."""
        code = self.process.poll()
        if code is not None and code != 0:
            raise SystemExit(f"{self.name} exited with {code}:\n{self.log_text()[-3000:]}")
        text = self.log_text()
        if "Traceback (most recent call last)" in text:
            self.process.kill()
            raise SystemExit(f"{self.name} raised:\n{text[:3000]}")


#: Extra options for every sqlqueue worker the bench starts, to measure what they cost (e.g.
#: ``--metrics-port 0``: Prometheus metrics on; ``--log-format json``).
WORKER_OPTIONS_VARIABLE = "SQLQUEUE_BENCH_WORKER_OPTIONS"


def sqlqueue_command(*, concurrency: int, poll_interval: float, burst: bool) -> list[str]:
    """``python -m sqlqueue worker bench.app:queue`` with these settings (INFO logs readiness),
    and the options of ``$SQLQUEUE_BENCH_WORKER_OPTIONS``."""
    command = [sys.executable, "-m", "sqlqueue", "--log-level", "INFO", "worker"]
    command += [APP, "--concurrency", str(concurrency)]
    command += ["--poll-interval", repr(poll_interval)]
    command += shlex.split(os.environ.get(WORKER_OPTIONS_VARIABLE, ""))
    return [*command, "--burst"] if burst else command


def raw_command(
    *, batch: int, poll_interval: float, burst: bool, record: Path | None = None
) -> list[str]:
    """``python -m bench.raw_worker`` with these settings (the URL goes in the environment)."""
    command = [sys.executable, "-m", "bench.raw_worker", "--batch", str(batch)]
    command += ["--poll-interval", repr(poll_interval)]
    if record is not None:
        command += ["--record", str(record)]
    return [*command, "--burst"] if burst else command


def peer_command(peer: str, *, in_flight: int, poll_interval: float) -> list[str]:
    """``python -m bench.peer_worker PEER``: a peer library's worker (``--burst`` to drain)."""
    command = [sys.executable, "-m", "bench.peer_worker", peer, "--in-flight", str(in_flight)]
    return [*command, "--poll-interval", repr(poll_interval)]


def start(
    command: Sequence[str], *, engine: str, name: str, url: str, logs: Path, record: Path | None
) -> Worker:
    """Start one worker process against ``url``; its stderr goes to ``logs/<name>.log``."""
    python_path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {
        **os.environ,
        "SQLQUEUE_DATABASE_URL": url,
        "PYTHONPATH": python_path,
        "PGAPPNAME": f"{APP_PREFIX}{name}",
    }
    if record is not None:
        env[RECORD_VARIABLE] = str(record)
    log = logs / f"{name}.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            list(command), cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=sink
        )
    return Worker(name=name, engine=engine, process=process, log=log)


def wait_ready(workers: Sequence[Worker], timeout: float) -> None:
    """Wait until every worker has said it is about to claim."""
    deadline = time.monotonic() + timeout
    while not all(worker.is_ready() for worker in workers):
        for worker in workers:
            worker.check_alive()
            if worker.process.poll() == 0:
                raise SystemExit(f"{worker.name} exited before it was ready")
        if time.monotonic() > deadline:
            late = [w.name for w in workers if not w.is_ready()]
            raise SystemExit(f"workers {late} were not ready after {timeout:g} s")
        time.sleep(0.05)


def stop_all(workers: Sequence[Worker], timeout: float = 30.0) -> None:
    """SIGTERM every worker still running, then wait (SIGKILL after ``timeout``)."""
    for worker in workers:
        if worker.process.poll() is None:
            worker.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for worker in workers:
        try:
            worker.process.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            worker.process.kill()
            worker.process.wait()


# -- /proc ---------------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` (all its threads), from ``/proc/<pid>/stat``."""
    stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii")
    # Fields after the command name (which may hold spaces) start at field 3, "state".
    fields = stat.rsplit(")", 1)[1].split()
    utime, stime = int(fields[11]), int(fields[12])
    return (utime + stime) / _CLOCK_TICKS


def children_cpu_seconds() -> float:
    """User + system CPU time of every child process this process has waited for so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def rss_bytes(pid: int) -> int:
    """Resident set size of process ``pid``, from ``/proc/<pid>/statm``."""
    statm = Path(f"/proc/{pid}/statm").read_text(encoding="ascii").split()
    return int(statm[1]) * _PAGE_SIZE
