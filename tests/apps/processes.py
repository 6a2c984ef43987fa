"""Starting real processes for the process tests, and waiting on them without ever hanging.

Children run with the repository root as their working directory (so ``tests.apps…`` imports)
and the test database in ``SQLQUEUE_DATABASE_URL``. Their output goes to a log file that a
failing assertion quotes; the tests count from database rows, never from these logs. They are
forked from the suite's fork server (``tests._support.forkserver``), past the imports that were
most of a start's CPU.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from tests._support import REPO_ROOT, child_env, forkserver, wait_until

__all__ = ["REPO_ROOT", "WorkerProcess", "Workers", "child_env", "wait_until"]

LEDGER_APP = "tests.apps.ledger_app:queue"


class WorkerProcess:
    """One ``python -m sqlqueue worker`` child process (``fresh``: exec'd, not forked)."""

    def __init__(
        self, args: Sequence[str], env: dict[str, str], log_path: Path, *, fresh: bool = False
    ) -> None:
        self.log_path = log_path
        self._log: IO[bytes] = log_path.open("wb")
        self.popen: forkserver.Process = forkserver.spawn(
            [sys.executable, "-m", "sqlqueue", "worker", *args],
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            fresh=fresh,
        )

    @property
    def pid(self) -> int:
        """The child's process id."""
        return self.popen.pid

    def log(self) -> str:
        """What the worker has logged so far."""
        return self.log_path.read_text(errors="replace")

    def describe(self) -> str:
        """Exit status and log tail, for assertion messages."""
        tail = "\n".join(self.log().splitlines()[-40:])
        return f"worker pid {self.pid} (exit {self.popen.poll()}) log tail:\n{tail}"

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until the worker has started serving (or fail if it died). A start imports
        sqlqueue and SQLAlchemy, a second or two of CPU: with three xdist workers each
        starting several at once on two cores, 30 s was seen too short."""

        def serving() -> bool:
            if self.popen.poll() is not None:
                raise AssertionError(f"the worker exited during start-up\n{self.describe()}")
            return "serving queues" in self.log()

        wait_until(serving, timeout=timeout, what="the worker to start", explain=self.describe)

    def send(self, sig: signal.Signals) -> None:
        """Send ``sig`` to the worker."""
        self.popen.send_signal(sig)

    def wait(self, timeout: float) -> int:
        """Wait for the worker to exit; fail (and kill it) if it takes longer than ``timeout``."""
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(timeout=10)
            raise AssertionError(
                f"the worker did not exit within {timeout:g} s\n{self.describe()}"
            ) from None

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM the worker and wait for it to exit; return its exit status."""
        self.send(signal.SIGTERM)
        return self.wait(timeout)

    def close(self) -> None:
        """Kill the worker if it is still running and close its log."""
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(timeout=10)
        self._log.close()


class Workers:
    """The worker processes of one test; whatever is still running at the end is killed."""

    def __init__(self, database_url: str, log_dir: Path) -> None:
        self._database_url = database_url
        self._log_dir = log_dir
        self._started: list[WorkerProcess] = []

    def start(
        self,
        *options: str,
        app: str = LEDGER_APP,
        lease_seconds: float | None = None,
        reaper_interval: float | None = None,
    ) -> WorkerProcess:
        """Start ``sqlqueue worker app *options``; ``lease_seconds`` sets the app's lease and
        ``reaper_interval`` how often its reaper runs (apps that call
        ``tests.apps.reaping.reap_as_the_environment_says``)."""
        extra = {"LEDGER_LEASE_SECONDS": str(lease_seconds)} if lease_seconds else {}
        if reaper_interval:
            extra["LEDGER_REAPER_INTERVAL"] = str(reaper_interval)
        log_path = self._log_dir / f"worker-{len(self._started) + 1}.log"
        worker = WorkerProcess([app, *options], child_env(self._database_url, **extra), log_path)
        self._started.append(worker)
        return worker

    def close(self) -> None:
        """Kill every worker still running."""
        for worker in self._started:
            worker.close()
