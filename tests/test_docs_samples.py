"""Every sample in the docs (``docs/**/*.md``) and the README runs, as written.

Each page's samples run in order in one namespace (Sybil reads the pages themselves), in a
fresh temporary directory, so ``sqlite:///app.db`` is a file of the test's own. A page whose
samples need a server says so in an HTML comment, ``<!-- samples-run-on: postgresql mysql -->``
(default: ``sqlite``); they then run once per backend named, with ``DATABASE_URL`` set to an
empty database of their own on the test server (skipped when unreachable; failed with
``CI=true``, as the rest of the suite). The set-up a reader needs is on the page; Sybil's
comments (``<!-- invisible-code-block: python -->``) only check what the samples did, or start a
stand-in for what the page says the reader provides (their SMTP server, their partner's HTTP
endpoint, their PgBouncer), kept in a ``contextlib.ExitStack``. A sample that is a file of the
reader's project (an alembic ``env.py``, a ``conftest.py``, a script a transcript runs) follows
``<!-- sample-file: path -->`` and is written there, not run.

Shell blocks (``console``, ``sh``, ``bash``) run in order with the Python samples, in the same
directory and environment, with the venv's ``bin`` first on ``PATH`` (``sqlqueue``,
``python``), on the page's first backend only (each command starts a Python of its own, about
half a second; what the commands call runs on every backend in its own tests). A transcript's
``$`` lines are compared with their real output, ``...`` standing for any text (ids, timings,
paths) and a timestamp shown for any timestamp (the rules: ``tests/_docs_blocks.py``). A block
that cannot run here says why, ``<!-- console: not-run (installs packages) -->``. YAML, TOML,
Dockerfile and ini (systemd unit) blocks must parse.

A page's ``ExitStack`` is closed and its environment variables, ``sys.path`` and the modules it
imported from its directory are put back when it ends, whether it passed or not. The pages in
``RERUN`` run twice in one directory, as a reader runs them again, and pass both times.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sybil import Document, Example, Region, Sybil
from sybil.parsers.myst import PythonCodeBlockParser, SkipParser

from tests._docs_blocks import SHELLS, OtherBlocks, run_shell_example
from tests.conftest import BACKENDS, _mysql_database, _postgres_database

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted(
    [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")],
    key=lambda path: str(path.relative_to(ROOT)),
)
PAGES = [page for page in PAGES if "_build" not in page.parts]
RUNS_ON = re.compile(r"<!--\s*samples-run-on:\s*([\w\s]+?)\s*-->")
SAMPLE_FILE = re.compile(r"<!--\s*sample-file:\s*(\S+)\s*-->\s*$")


class _SampleFileWriter:
    """Writes a sample to ``path`` (relative to the test's directory) instead of running it."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __call__(self, example: Example) -> None:
        target = Path(self.path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(str(example.parsed), encoding="utf-8")
        # A module written while the interpreter runs must be announced to the import system
        # (the importlib docs): its path finders cache each folder's listing until the
        # folder's mtime changes, and a folder made and filled within one kernel timestamp
        # tick keeps the mtime it had when empty. A random-order run (seed 357027983) could
        # not import a ``myapp/jobs.py`` written this way; its folder's mtime was the one it
        # was made with, so a listing cached in between would never have been refreshed.
        importlib.invalidate_caches()


class _PythonSamples:
    """Sybil's python code blocks, each run in the page's namespace, but those right after a
    ``<!-- sample-file: path -->`` comment, which are written to that file."""

    def __init__(self) -> None:
        self.blocks = PythonCodeBlockParser()

    def __call__(self, document: Document) -> Iterator[Region]:
        for region in self.blocks(document):
            marker = SAMPLE_FILE.search(document.text, 0, region.start)
            if marker is not None:
                region.evaluator = _SampleFileWriter(marker.group(1))
            yield region


SYBIL = Sybil(parsers=[_PythonSamples(), OtherBlocks(), SkipParser()], path=str(ROOT))
CHECKED = re.compile(r"^```(python|yaml|toml|dockerfile|ini|" + "|".join(SHELLS) + r")\s*$", re.M)
# The venv's console scripts (``sqlqueue``, ``alembic``) and python first, as for a reader
# whose venv is active.
VENV_BIN = str(Path(sys.executable).parent)


# Pages a reader runs from top to bottom more than once, in the same directory: on its first
# backend, each runs twice, the second time on the first one's files and database (tables,
# jobs, idempotency keys), and passes both times.
RERUN = {"README.md", "docs/tutorial/first-job.md"}


def _backends(page: Path) -> list[str]:
    found = RUNS_ON.search(page.read_text(encoding="utf-8"))
    return found.group(1).split() if found else ["sqlite"]


def _cases() -> Iterator[object]:
    for page in PAGES:
        if not CHECKED.search(page.read_text(encoding="utf-8")):
            continue
        for backend in _backends(page):
            name = str(page.relative_to(ROOT))
            marks = (
                []
                if backend in BACKENDS
                else [pytest.mark.skip(reason=f"{backend} not in SQLQUEUE_TEST_BACKENDS")]
            )
            yield pytest.param(page, backend, id=f"{name}-{backend}", marks=marks)


@pytest.fixture
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database for one page's samples, on the backend the test is for."""
    backend = request.node.callspec.params["backend"]
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'app.db'}"
    elif backend == "postgresql":
        yield from _postgres_database("docs")
    else:
        yield from _mysql_database("docs")


@pytest.mark.parametrize(("page", "backend"), list(_cases()))
def test_samples_run(
    page: Path, backend: str, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = backend == _backends(page)[0]
    runs = 2 if first and str(page.relative_to(ROOT)) in RERUN else 1
    for _ in range(runs):
        _run_page(page, database_url, tmp_path, monkeypatch, shells=first)


def _run_page(
    page: Path,
    database_url: str,
    directory: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    shells: bool,
) -> None:
    """Runs ``page``'s samples in order in ``directory`` (its shell blocks only if ``shells``),
    and puts back what they changed."""
    monkeypatch.chdir(directory)
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("PATH", os.pathsep.join([VENV_BIN, os.environ.get("PATH", "")]))
    for variable in ("SQLQUEUE_DATABASE_URL", "SQLQUEUE_SCHEMA"):  # a page sets its own
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(sys, "argv", [str(page)])
    # The page's directory first, as `python` puts the reader's script's: ``myapp`` imports.
    monkeypatch.setattr(sys, "path", [str(directory), *sys.path])
    environment = dict(os.environ)
    modules = set(sys.modules)
    document = SYBIL.parse(page)
    # A module of its own, as the reader's file would be (``Flask(__name__)`` finds its root
    # path from it; ``if __name__ == "__main__":`` blocks stay for the reader to run).
    document.namespace["__name__"] = f"sample_{page.stem.replace('-', '_')}"
    try:
        for example in document.examples():
            if shells or example.region.evaluator is not run_shell_example:
                example.evaluate()
    finally:
        for value in list(document.namespace.values()):  # its servers; its engines' pools
            if isinstance(value, contextlib.ExitStack):
                value.close()
            elif isinstance(value, sa.Engine):
                value.dispose()
        os.environ.clear()
        os.environ.update(environment)
        for name in set(sys.modules) - modules:  # the page's own modules (``myapp``)
            if _defined_under(sys.modules[name], directory):
                del sys.modules[name]


def _defined_under(module: object, directory: Path) -> bool:
    """Whether ``module`` was imported from a file in ``directory`` (a namespace package, which
    has no file: from a folder there)."""
    file = getattr(module, "__file__", None)
    if file is None:
        file = next(iter(getattr(module, "__path__", None) or []), None)
    return file is not None and Path(file).resolve().is_relative_to(directory.resolve())
