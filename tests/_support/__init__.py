"""What the tests share, in one place: waiting for an effect (``wait_until``), ports without a
race, the CLI runner, putting jobs in and draining them, a worker in a thread.

``tests._support.web`` (uvicorn, the web page's fixtures) and ``tests._support.postgres`` (a
private PostgreSQL cluster) are imported by the tests that need them.
"""

from __future__ import annotations

from tests._support.cli import REPO_ROOT, child_env, run_cli, sqlqueue_command
from tests._support.jobs import count_jobs, db_now, drain, enqueue
from tests._support.ports import listening_socket, port_in, refusing_port
from tests._support.threads import WorkerThread
from tests._support.waiting import DEADLINE_SECONDS, DeadlineExceeded, bounded, wait_until

__all__ = [
    "DEADLINE_SECONDS",
    "REPO_ROOT",
    "DeadlineExceeded",
    "WorkerThread",
    "bounded",
    "child_env",
    "count_jobs",
    "db_now",
    "drain",
    "enqueue",
    "listening_socket",
    "port_in",
    "refusing_port",
    "run_cli",
    "sqlqueue_command",
    "wait_until",
]
