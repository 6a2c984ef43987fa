"""``python -m bench compare``'s environments: each revision installed in a virtualenv of its own.

A revision is a git commit (anything ``git rev-parse`` takes: ``main``, ``HEAD~1``, a hash) or
the **working tree**: HEAD with the uncommitted and untracked (not ignored) changes of the
files the wheel is built from (:data:`BUILD_PATHS`). Its source is exported to a scratch
directory (``git archive`` of the commit; a copy of those files as they are on disk) and
installed **non-editable**, ``pip install DIR[postgres,mysql]``, into a virtualenv made with the
interpreter running the comparison. pip reads the configured index and its caches.

Virtualenvs are kept under the cache directory (``$XDG_CACHE_HOME/sqlqueue-bench``, else
``~/.cache/sqlqueue-bench``), one per commit hash, or per digest of the working tree's build
files, and Python version; ``built.json`` is written last, so a half-built one is rebuilt. A
working tree without changes to the build files is HEAD's commit and shares its virtualenv.

**One harness for both sides.** The benchmark code is the current checkout's ``bench/``,
copied to a scratch directory that holds no ``sqlqueue`` package, so that each side's harness
and the worker processes it starts (their working directory and ``PYTHONPATH`` are that
directory, bench/processes.py) import the sqlqueue installed in the side's virtualenv, and only
sqlqueue differs. :func:`probe` checks that from a worker's point of view before anything is
measured. The harness uses sqlqueue's public API for the drain and enqueue scenarios; when a
revision lacks something it uses, :func:`diagnose` says so instead of a bare traceback.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

__all__ = [
    "BUILD_PATHS",
    "Revision",
    "Side",
    "build",
    "cache_dir",
    "checkout_state",
    "copy_harness",
    "diagnose",
    "probe",
    "prune",
    "resolve",
    "same_build",
    "side_environment",
]

#: What the wheel is built from (pyproject.toml's hatch settings): the working tree's copy.
BUILD_PATHS = ("pyproject.toml", "README.md", "sqlqueue", "migrations")
#: The extras every side installs: the PostgreSQL and MariaDB/MySQL drivers the harness and
#: the workers use (``--backends mysql`` needs PyMySQL in both virtualenvs; pip only warns
#: about an extra a revision older than MariaDB support does not have).
EXTRA = "postgres,mysql"
_PROBE = """\
import importlib.util, json, sys
import sqlqueue, bench
import bench.run, bench.runner  # the harness's drain and enqueue scenarios, on this sqlqueue
print(json.dumps({
    "sqlqueue": sqlqueue.__file__,
    "sqlqueue_main": importlib.util.find_spec("sqlqueue.__main__").origin,
    "version": getattr(sqlqueue, "__version__", "?"),
    "bench": bench.__file__,
    "python": sys.version.split()[0],
}))
"""
_MISSING = re.compile(
    r"^(?:ModuleNotFoundError|ImportError|AttributeError|TypeError)\b.*\bsqlqueue\b.*$",
    re.MULTILINE,
)


@dataclass(frozen=True, kw_only=True)
class Revision:
    """What one side of the comparison runs: a commit, or the working tree on top of HEAD."""

    #: As asked for: ``main``, ``HEAD~1``, ``working tree``.
    name: str
    #: The full hash of the commit (HEAD's, for the working tree).
    commit: str
    #: The working tree's build files' SHA-256 when they differ from HEAD; else ``None``.
    tree_digest: str | None = None

    @property
    def short(self) -> str:
        """``2efc41e`` or ``2efc41e+changes``."""
        return self.commit[:7] + ("+changes" if self.tree_digest else "")

    @property
    def title(self) -> str:
        """``main (2efc41e)``."""
        return f"{self.name} ({self.short})"

    @property
    def cache_key(self) -> str:
        """The virtualenv's directory name: the commit, or the working tree's digest, and the
        Python version; ``-db2`` marks the virtualenvs with both drivers (those built before
        held only PostgreSQL's)."""
        version = f"py{sys.version_info.major}.{sys.version_info.minor}-db2"
        if self.tree_digest:
            return f"tree-{self.tree_digest[:20]}-{version}"
        return f"{self.commit}-{version}"

    @property
    def slug(self) -> str:
        """For file names: ``2efc41e`` or ``tree-1a2b3c4d``."""
        return f"tree-{self.tree_digest[:8]}" if self.tree_digest else self.commit[:7]


@dataclass(frozen=True, kw_only=True)
class Side:
    """A revision built and checked: the interpreter to run the harness with, and what it
    imported."""

    letter: str
    revision: Revision
    python: Path
    #: :func:`probe`'s findings: where sqlqueue, ``python -m sqlqueue`` and bench came from.
    imported: dict[str, str]


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "--no-optional-locks", *args],
        cwd=repo,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        raise SystemExit(f"git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def _tree_files(repo: Path) -> list[str]:
    """The build files as they are on disk: tracked ones that exist, and untracked unignored."""
    listed = _git(repo, "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--")
    wanted = [
        path
        for path in sorted(set(listed.split("\0")))
        if path and (path in BUILD_PATHS or path.split("/", 1)[0] in BUILD_PATHS)
    ]
    return [path for path in wanted if (repo / path).is_file()]


def _tree_digest(repo: Path, files: Sequence[str]) -> str:
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.encode() + b"\0")
        digest.update((repo / path).read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()


def resolve(repo: Path, name: str | None) -> Revision:
    """The commit ``name`` names, or with ``None`` the working tree (HEAD when its build files
    have no changes)."""
    if name is not None:
        done = subprocess.run(
            ["git", "rev-parse", "--verify", "--quiet", f"{name}^{{commit}}"],
            cwd=repo,
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode:
            raise SystemExit(f"{name!r} is not a commit of this repository (git rev-parse)")
        return Revision(name=name, commit=done.stdout.strip())
    head = _git(repo, "rev-parse", "--verify", "HEAD").strip()
    changed = _git(repo, "status", "--porcelain", "--untracked-files=all", "--", *BUILD_PATHS)
    if not changed.strip():
        return Revision(name="working tree", commit=head)
    digest = _tree_digest(repo, _tree_files(repo))
    return Revision(name="working tree", commit=head, tree_digest=digest)


def _build_trees(repo: Path, revision: Revision) -> list[str]:
    """The git object ids of a commit's build paths (``-`` for one it lacks)."""
    found = []
    for path in BUILD_PATHS:
        done = subprocess.run(
            ["git", "rev-parse", "--verify", "--quiet", f"{revision.commit}:{path}"],
            cwd=repo,
            capture_output=True,
            text=True,
            check=False,
        )
        found.append(done.stdout.strip() if done.returncode == 0 else "-")
    return found


def same_build(repo: Path, a: Revision, b: Revision) -> bool:
    """Whether A and B install the same sqlqueue (their build files are identical): then the
    comparison is an A/A run, and whatever it flags is the machine's noise."""
    if a.tree_digest or b.tree_digest:
        return a.cache_key == b.cache_key
    return _build_trees(repo, a) == _build_trees(repo, b)


def checkout_state(repo: Path) -> str:
    """The checkout's HEAD, ``+changes`` when tracked files differ: where the harness came from."""
    head = _git(repo, "rev-parse", "--short=7", "HEAD").strip()
    dirty = _git(repo, "status", "--porcelain", "--untracked-files=no").strip()
    return head + ("+changes" if dirty else "")


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/sqlqueue-bench``, else ``~/.cache/sqlqueue-bench``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "sqlqueue-bench"


def _export(repo: Path, revision: Revision, into: Path) -> None:
    """The revision's source, as the wheel sees it, into an empty directory."""
    if revision.tree_digest is None:
        archive = into.parent / "source.tar"
        _git(repo, "archive", "--format=tar", f"--output={archive}", revision.commit)
        with tarfile.open(archive) as tar:
            tar.extractall(into, filter="data")
        archive.unlink()
        return
    for path in _tree_files(repo):
        target = into / path
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo / path, target)


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One build of a revision at a time, whichever comparison asks for it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _run(command: Sequence[str], what: str) -> None:
    done = subprocess.run(list(command), capture_output=True, text=True, check=False)
    if done.returncode:
        output = (done.stdout + done.stderr).strip()[-3000:]
        raise SystemExit(f"{what} failed ({' '.join(command)}):\n{output}")


def build(repo: Path, revision: Revision, cache: Path) -> Path:
    """The python of the revision's virtualenv, built unless the cache has it."""
    home = cache / revision.cache_key
    python = home / "bin" / "python"
    marker = home / "built.json"
    with _locked(cache / f"{revision.cache_key}.lock"):
        if marker.is_file():
            marker.touch()  # used now: the last to be pruned
            print(f"{revision.title}: cached in {home}", file=sys.stderr, flush=True)
            return python
        print(f"{revision.title}: building in {home}", file=sys.stderr, flush=True)
        shutil.rmtree(home, ignore_errors=True)
        with tempfile.TemporaryDirectory(prefix="sqlqueue-compare-src-") as scratch:
            source = Path(scratch) / "source"
            source.mkdir()
            _export(repo, revision, source)
            _run([sys.executable, "-m", "venv", str(home)], f"the virtualenv of {revision.title}")
            _run(
                [str(python), "-m", "pip", "install", "--quiet", f"{source}[{EXTRA}]"],
                f"installing {revision.title}",
            )
        built = {
            "name": revision.name,
            "commit": revision.commit,
            "tree_digest": revision.tree_digest,
            "built_at": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        marker.write_text(json.dumps(built, indent=2) + "\n", encoding="utf-8")
    return python


def prune(cache: Path, keep: int, using: Sequence[Revision]) -> list[Path]:
    """Remove all but the ``keep`` most recently used virtualenvs (never those in ``using``);
    returns what was removed. A working tree's digest changes with every edit, so its
    virtualenvs would otherwise pile up (~80 MB each)."""
    kept = {revision.cache_key for revision in using}
    built = sorted(
        (marker.stat().st_mtime, marker.parent)
        for marker in cache.glob("*/built.json")
        if marker.parent.name not in kept
    )
    removed = [home for _, home in built[: max(len(built) - max(keep - len(kept), 0), 0)]]
    for home in removed:
        shutil.rmtree(home, ignore_errors=True)
        home.with_name(f"{home.name}.lock").unlink(missing_ok=True)
    return removed


def copy_harness(repo: Path, into: Path) -> Path:
    """This checkout's ``bench/`` (results and caches left out) in ``into``, which then holds a
    ``bench`` package and no ``sqlqueue``; returns ``into``."""
    shutil.copytree(
        repo / "bench",
        into / "bench",
        ignore=shutil.ignore_patterns("results", "__pycache__", "*.pyc"),
    )
    return into


def side_environment(harness: Path) -> dict[str, str]:
    """The environment a side's harness runs in: nothing on the path but the harness, no user
    site-packages, so sqlqueue can only come from the side's virtualenv."""
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
    }
    env["PYTHONNOUSERSITE"] = "1"
    return env


def probe(letter: str, revision: Revision, python: Path, harness: Path) -> Side:
    """Import sqlqueue and the harness as a worker process will (cwd and ``PYTHONPATH`` the
    harness), and check that sqlqueue comes from the revision's virtualenv."""
    env = {**side_environment(harness), "PYTHONPATH": str(harness)}
    done = subprocess.run(
        [str(python), "-c", _PROBE],
        cwd=harness,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        raise SystemExit(diagnose(done.stderr, revision.title))
    imported: dict[str, str] = json.loads(done.stdout.strip().splitlines()[-1])
    home = python.parent.parent.resolve()
    for name in ("sqlqueue", "sqlqueue_main"):
        if not Path(imported[name]).resolve().is_relative_to(home):
            raise SystemExit(
                f"{revision.title}: sqlqueue was imported from {imported[name]}, not from its "
                f"virtualenv {home}: something on the path shadows it"
            )
    if not Path(imported["bench"]).resolve().is_relative_to(harness.resolve()):
        raise SystemExit(f"{revision.title}: bench was imported from {imported['bench']}")
    return Side(letter=letter, revision=revision, python=python, imported=imported)


def diagnose(stderr: str, title: str) -> str:
    """What to say when a side's harness failed: a missing piece of sqlqueue named as such."""
    missing = _MISSING.findall(stderr)
    if missing:
        return (
            f"{title}: the harness (this checkout's bench/) uses something this revision's "
            f"sqlqueue does not have: {missing[-1].strip()}\n"
            "Both sides run the same harness so that only sqlqueue differs; compare revisions "
            "whose public API the drain and enqueue scenarios use, or run the older revision's "
            "own `python -m bench --json` and `--compare` the files (bench/README.md)."
        )
    return f"{title}: the benchmark failed:\n{stderr.strip()[-3000:]}"
