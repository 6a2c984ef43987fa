"""Every Python sample in the docs (``docs/**/*.md``) and the README runs, as written.

Each page's samples run in order in one namespace (Sybil reads the pages themselves), in a
fresh temporary directory, so ``sqlite:///app.db`` is a file of the test's own. A page whose
samples need a server says so in an HTML comment, ``<!-- samples-run-on: postgresql mysql -->``
(default: ``sqlite``); they then run once per backend named, with ``DATABASE_URL`` set to an
empty database of their own on the test server (skipped when unreachable; failed with
``CI=true``, as the rest of the suite). Sybil's own comments (``<!-- invisible-code-block:
python -->``) set a page's samples up, start the servers they talk to and check what they did,
where the reader need not see it; a sample that is a file of the reader's project (an alembic
``env.py``, a ``conftest.py``) follows ``<!-- sample-file: path -->`` and is written there, for
the page's invisible blocks to run the way its tool would. A page's ``contextlib.ExitStack``
(its servers) is closed and its environment variables, ``sys.path`` and the modules it
imported from its directory are put back when it ends, whether it passed or not.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sybil import Document, Example, Region, Sybil
from sybil.parsers.myst import PythonCodeBlockParser, SkipParser

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


SYBIL = Sybil(parsers=[_PythonSamples(), SkipParser()], path=str(ROOT))


def _backends(page: Path) -> list[str]:
    found = RUNS_ON.search(page.read_text(encoding="utf-8"))
    return found.group(1).split() if found else ["sqlite"]


def _cases() -> Iterator[object]:
    for page in PAGES:
        if "```python" not in page.read_text(encoding="utf-8"):
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
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setattr(sys, "argv", [str(page)])
    monkeypatch.setattr(sys, "path", list(sys.path))
    environment = dict(os.environ)
    modules = set(sys.modules)
    document = SYBIL.parse(page)
    # A module of its own, as the reader's file would be (``Flask(__name__)`` finds its root
    # path from it; ``if __name__ == "__main__":`` blocks stay for the reader to run).
    document.namespace["__name__"] = f"sample_{page.stem.replace('-', '_')}"
    try:
        for example in document.examples():
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
            if _defined_under(sys.modules[name], tmp_path):
                del sys.modules[name]


def _defined_under(module: object, directory: Path) -> bool:
    """Whether ``module`` was imported from a file in ``directory``."""
    file = getattr(module, "__file__", None)
    return file is not None and Path(file).resolve().is_relative_to(directory.resolve())
