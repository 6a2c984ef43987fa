"""Running the ``sqlqueue`` console script the way a user does: a process of its own, in the
repository root, configured only by the arguments and environment the test gives it. It is
forked from the suite's fork server (``tests._support.forkserver``: the imports are done once)
unless the test asks for a freshly exec'd interpreter."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

__all__ = ["REPO_ROOT", "child_env", "run_cli", "sqlqueue_command"]

REPO_ROOT = Path(__file__).resolve().parents[2]


def child_env(database_url: str, **extra: str) -> dict[str, str]:
    """The environment of a child process: ours plus the database URL and ``extra``."""
    env = dict(os.environ)
    env.update(SQLQUEUE_DATABASE_URL=database_url, PYTHONUNBUFFERED="1", **extra)
    return env


def sqlqueue_command() -> list[str]:
    """The installed ``sqlqueue`` console script (next to this interpreter)."""
    found = shutil.which("sqlqueue", path=str(Path(sys.executable).parent))
    if found is None:
        raise AssertionError(
            "the sqlqueue console script is not installed next to "
            f"{sys.executable}: pip install -e '.[test]'"
        )
    return [found]


def run_cli(
    *args: str,
    url: str | None = None,
    cwd: Path = REPO_ROOT,
    timeout: float = 120,
    env: Mapping[str, str] | None = None,
    fresh: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run ``sqlqueue ARGS`` and return what it did (exit code, stdout, stderr as text).

    No ``SQLQUEUE_*`` setting leaks in from the test's own environment: ``url`` becomes
    ``SQLQUEUE_DATABASE_URL`` and ``env`` adds variables (``{"SQLQUEUE_SCHEMA": "ops"}``).

    The run is a fork of the fork server, already past its imports. ``fresh=True`` execs the
    installed script in a new interpreter instead: for a test of the script itself (its
    start-up, ``--version``), and for one whose environment only an interpreter's start takes
    (``PYTHONPATH`` putting a stand-in module first: the fork server refuses those)."""
    # Imported here: tests._support imports this module, and the fork server runs as
    # ``python -m tests._support.forkserver``, which must not be imported before it runs.
    from tests._support import forkserver

    environment = {k: v for k, v in os.environ.items() if not k.startswith("SQLQUEUE_")}
    if url is not None:
        environment["SQLQUEUE_DATABASE_URL"] = url
    environment.update(env or {})
    return forkserver.run(
        [*sqlqueue_command(), *args], env=environment, cwd=cwd, timeout=timeout, fresh=fresh
    )
