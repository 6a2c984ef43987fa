"""Running the test Django project as Django runs: ``manage.py`` in its directory, a
``sqlqueue_worker`` process, gunicorn serving its WSGI application."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import sqlalchemy as sa

__all__ = ["PROJECT", "manage", "manage_json", "prepare", "project_env", "rows"]

PROJECT = Path(__file__).resolve().parent / "django_project"


def project_env(url: str) -> dict[str, str]:
    """The environment of the project's processes: its database, and nothing of ours."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SQLQUEUE_", "DJANGO_"))}
    env.update(SHOP_DATABASE_URL=url, PYTHONUNBUFFERED="1")
    return env


def manage(url: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python manage.py ARGS`` on the database ``url``; fails the test if it fails."""
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=PROJECT,
        env=project_env(url),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(
            f"manage.py {' '.join(args)} exited {done.returncode}\n{done.stdout}\n{done.stderr}"
        )
    return done


def manage_json(url: str, *args: str) -> dict[str, Any]:
    """The JSON a project command printed on its last line."""
    result: dict[str, Any] = json.loads(manage(url, *args).stdout.strip().splitlines()[-1])
    return result


def prepare(url: str) -> None:
    """The shop's tables (Django's ``migrate``) next to sqlqueue's (already migrated)."""
    manage(url, "migrate", "--run-syncdb", "--verbosity", "0")


def rows(engine: sa.Engine, sql: str) -> list[tuple[Any, ...]]:
    """The rows of a query, read on the test's own connection."""
    with engine.connect() as conn:
        return [tuple(row) for row in conn.execute(sa.text(sql))]
