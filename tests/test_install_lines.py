"""A guide's install line brings everything its sample needs. The sample runs in an interpreter
that can import only the standard library and what that one ``pip install`` line installs (the
distributions it names, with the extras it asks for, and everything they require), as in a
fresh virtualenv where a reader ran just that line: an import of anything else fails as it
would there.

The FastAPI guide's line lacked an HTTP client for ``fastapi.testclient`` (Starlette's, which
wants httpx2, and falls back to httpx with a deprecation warning): the sample failed."""

from __future__ import annotations

import importlib.metadata
import re
import shlex
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests._support import REPO_ROOT

pytestmark = pytest.mark.timeout(180)

#: Guides whose Python samples run on their own (no invisible set-up, no server).
GUIDES = ["docs/guides/fastapi.md"]

#: Run in the child: refuse to import a top-level module from site-packages unless it is one of
#: ``ALLOWED`` (the standard library, and sqlqueue's editable install, live elsewhere), then
#: run the sample as a script.
FENCE = """\
import importlib.machinery
import site
import sys

ALLOWED = set(sys.argv[1].split(","))
SITE_PACKAGES = tuple(site.getsitepackages())


class NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if "." in name or name in ALLOWED:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        where = spec and (spec.origin or next(iter(spec.submodule_search_locations or []), ""))
        if where and where.startswith(SITE_PACKAGES):
            raise ModuleNotFoundError(f"No module named {name!r} (not installed)", name=name)
        return None


sys.meta_path.insert(0, NotInstalled())
with open(sys.argv[2], encoding="utf-8") as sample:
    exec(compile(sample.read(), sys.argv[2], "exec"), {"__name__": "__main__"})
"""


def install_line(page: str) -> list[str]:
    """The requirements of the page's one ``pip install`` line."""
    lines = [line for line in page.splitlines() if line.startswith("pip install ")]
    assert len(lines) == 1, lines
    return shlex.split(lines[0], comments=True)[2:]


def python_samples(page: str) -> str:
    """The page's Python blocks, in order, as one program."""
    blocks = re.findall(r"^```python\n(.*?)^```$", page, flags=re.DOTALL | re.MULTILINE)
    assert blocks
    return "\n".join(blocks)


def installed_by(requirements: Iterable[str]) -> set[str]:
    """The distributions (canonical names) that ``requirements`` install: each one and,
    recursively, what it requires with the extras asked of it, on this interpreter."""
    extras_seen: dict[str, set[str]] = {}
    pending = [Requirement(text) for text in requirements]
    while pending:
        requirement = pending.pop()
        name = canonicalize_name(requirement.name)
        seen = extras_seen.setdefault(name, set())
        extras = ({""} | set(requirement.extras)) - seen
        if not extras:
            continue
        seen |= extras
        for text in importlib.metadata.requires(requirement.name) or []:
            needed = Requirement(text)
            if needed.marker is None or any(
                needed.marker.evaluate({"extra": extra}) for extra in extras
            ):
                pending.append(needed)
    return set(extras_seen)


def importable(distributions: set[str]) -> set[str]:
    """The top-level modules of ``distributions``, and sqlqueue's own (an editable install
    records none)."""
    modules = {
        module
        for module, owners in importlib.metadata.packages_distributions().items()
        if any(canonicalize_name(owner) in distributions for owner in owners)
    }
    return modules | {"sqlqueue"}


def test_the_closure_follows_extras_and_leaves_out_what_no_one_asked_for() -> None:
    # The checker itself: an extra brings its requirements (and theirs), nothing else comes.
    found = installed_by(["sqlalchemy-sqlqueue[async]"])
    assert {"sqlalchemy-sqlqueue", "sqlalchemy", "alembic", "aiosqlite", "greenlet"} <= found
    assert found.isdisjoint({"httpx", "httpx2", "fastapi", "psycopg", "pytest"})
    assert "httpx2" in importable(installed_by(["httpx2"]))


@pytest.mark.parametrize("guide", GUIDES)
def test_a_guides_sample_runs_with_what_its_install_line_installs(
    guide: str, tmp_path: Path
) -> None:
    page = (REPO_ROOT / guide).read_text(encoding="utf-8")
    allowed = importable(installed_by(install_line(page)))
    (tmp_path / "sample.py").write_text(python_samples(page), encoding="utf-8")
    (tmp_path / "fence.py").write_text(FENCE, encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "fence.py", ",".join(sorted(allowed)), "sample.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr == ""  # not even a warning (such as httpx's, that it is deprecated)
