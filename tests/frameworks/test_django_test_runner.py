"""sqlqueue under Django's own test runner, as a Django user meets it: a project whose tests
import the tasks module at the top, use ``TestCase`` and ``TransactionTestCase`` with Django's
default test settings (on SQLite, Django's in-memory test database), enqueue, drain with
``sqlqueue.testing`` and assert — run by ``manage.py test`` in a process of its own, on each
backend. sqlqueue's tables come from its Django migration (nobody runs ``sqlqueue_migrate``),
and the development database is never touched."""

from __future__ import annotations

import importlib
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import sqlalchemy as sa

from sqlqueue._schema import SCHEMA_REVISION
from tests.conftest import BACKENDS, _mysql_database, _postgres_database
from tests.frameworks.django_support import project_env

TEMPLATE = Path(__file__).resolve().parent / "django_tested_project"
#: What the project's shop/tests.py holds (four tests in each kind of test case, one more, and
#: one under ``override_settings(DATABASES=…)``) and shop/tests_guide.py (the guide's sample).
TESTS = 11


GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "django.md"
#: The guide's sample files, and the file of the project above that each one is.
GUIDE_SAMPLES = {
    "shop/jobs.py": "shop/jobs.py",
    "shop/views.py": "shop/views.py",
    "shop/tests.py": "shop/tests_guide.py",
}


@contextmanager
def development_database(name: str, tmp_path: Path, worker: str) -> Iterator[str]:
    """The URL of the project's development database: new and empty (a SQLite file not yet
    made, a database of its own on the server), so that anything written there shows."""
    if name == "sqlite":
        yield f"sqlite:///{tmp_path / 'development.db'}"
        return
    made = _postgres_database if name == "postgresql" else _mysql_database
    with contextmanager(made)(worker) as url:
        yield url


def sqlqueue_tables(url: str) -> list[str]:
    """The sqlqueue tables in the database at ``url`` (a missing SQLite file has none)."""
    parsed = sa.make_url(url)
    if parsed.get_backend_name() == "sqlite" and not Path(parsed.database or "").exists():
        return []
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        names = sa.inspect(engine).get_table_names()
    finally:
        engine.dispose()
    return sorted(name for name in names if name.startswith("sqlqueue"))


@pytest.mark.parametrize("name", BACKENDS)
def test_djangos_test_runner_runs_the_projects_sqlqueue_tests_on_the_test_database(
    name: str, tmp_path: Path, worker_id: str
):
    project = tmp_path / "project"
    shutil.copytree(TEMPLATE, project)
    with development_database(name, tmp_path, worker_id) as development:
        done = subprocess.run(
            [sys.executable, "manage.py", "test", "shop", "--noinput", "--verbosity", "2"],
            cwd=project,
            env=project_env(development),
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
        report = f"{done.stdout}\n{done.stderr}"
        assert done.returncode == 0, report
        assert f"Ran {TESTS} tests" in done.stderr, report
        assert "Applying sqlqueue.0001_sqlqueue_tables... OK" in report
        # The tests ran on the test database only: the development one has no sqlqueue table.
        assert sqlqueue_tables(development) == []


def test_the_latest_django_migration_runs_the_schemas_latest_revision():
    """A new revision of sqlqueue's tables comes with a Django migration, or ``manage.py
    migrate`` would leave an upgraded app on the old tables."""
    import sqlqueue.django.migrations as package

    directory = Path(package.__file__).parent
    latest = sorted(path.stem for path in directory.glob("[0-9][0-9][0-9][0-9]_*.py"))[-1]
    migration = importlib.import_module(f"{package.__name__}.{latest}")
    assert migration.Migration.sqlqueue_revision == SCHEMA_REVISION


def test_the_guides_app_and_its_test_are_the_projects_that_django_runs_above():
    """The Django guide's ``shop/jobs.py``, ``shop/views.py`` and ``shop/tests.py`` are the
    tested project's files (its tests place orders through that view, and the guide's test
    runs as ``shop/tests_guide.py``): a sample that drifts from code that runs fails here."""
    text = GUIDE.read_text(encoding="utf-8")
    for shown, file in GUIDE_SAMPLES.items():
        found = re.search(
            re.escape(f"<!-- sample-file: {shown} -->") + r"\n```python\n(.*?)```", text, re.DOTALL
        )
        assert found is not None, shown
        assert found.group(1) == (TEMPLATE / file).read_text(encoding="utf-8"), shown
