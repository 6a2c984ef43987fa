"""Developer sessions: ``nox`` runs lint, typecheck and tests; ``nox -s NAME`` runs one.

The test suite runs every backend test on a SQLite file, on PostgreSQL (default
``postgresql+psycopg://postgres@127.0.0.1:5432/test``, override with
``SQLQUEUE_TEST_POSTGRES_URL``) and on MariaDB (default
``mysql+pymysql://root@127.0.0.1:3306/test``, override with ``SQLQUEUE_TEST_MYSQL_URL``);
``wheel`` proves an installed wheel can migrate all three. Run nox from the project's
environment (``pip install -e ".[dev]"``): ``wheel`` talks to PostgreSQL and MariaDB from the
nox process itself.
"""

from __future__ import annotations

import os
import secrets
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import nox

nox.options.sessions = ["lint", "typecheck", "tests"]

ROOT = Path(__file__).resolve().parent
POSTGRES_URL = os.environ.get(
    "SQLQUEUE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
MYSQL_URL = os.environ.get("SQLQUEUE_TEST_MYSQL_URL", "mysql+pymysql://root@127.0.0.1:3306/test")
SQLQUEUE_TABLES = {"sqlqueue_jobs", "sqlqueue_alembic_version"}
#: The SQLAlchemy minor lines sqlqueue supports, as pip requirements.
SQLALCHEMY_LINES = {"2.0": "sqlalchemy>=2.0.30,<2.1", "2.1": "sqlalchemy>=2.1,<2.2"}


@nox.session
def tests(session: nox.Session) -> None:
    """The conformance suite on SQLite, PostgreSQL and MariaDB (pytest arguments after ``--``)."""
    session.install(".[test]")
    session.run("pytest", *session.posargs)


@nox.session
@nox.parametrize("backend", ["sqlite", "postgresql", "mysql"])
def tests_backend(session: nox.Session, backend: str) -> None:
    """The conformance suite on one backend only: ``nox -s "tests_backend(backend='sqlite')"``."""
    session.install(".[test]")
    session.run("pytest", *session.posargs, env={"SQLQUEUE_TEST_BACKENDS": backend})


@nox.session
def django_load(session: nox.Session) -> None:
    """The Django load test at the issue's length: 16 concurrent requests through gunicorn for
    20 s per backend, some rolled back; prints the figures (0 lost, 0 duplicated, 0 ghosts)."""
    session.install(".[test]")
    session.run(
        "pytest", "tests/frameworks/test_django_load.py", "-m", "slow", "-s", *session.posargs
    )


@nox.session
def hypothesis(session: nox.Session) -> None:
    """The property tests (every test module that uses Hypothesis) with many more examples
    (``HYPOTHESIS_PROFILE=long``, see ``tests/_hypothesis.py``); pytest arguments after ``--``."""
    session.install(".[test]")
    modules = sorted(
        str(path.relative_to(ROOT))
        for path in (ROOT / "tests").glob("test_*.py")
        if "from hypothesis import" in path.read_text(encoding="utf-8")
    )
    session.run(
        "pytest",
        *modules,
        "--timeout=3600",  # 500 examples of a test on a server backend take minutes
        *session.posargs,
        env={"HYPOTHESIS_PROFILE": "long"},
    )


@nox.session
def tests_sqlalchemy20(session: nox.Session) -> None:
    """The suite on the oldest SQLAlchemy line we support, 2.0."""
    session.install(".[test]", SQLALCHEMY_LINES["2.0"])
    session.run("python", "-c", "import sqlalchemy; print('SQLAlchemy', sqlalchemy.__version__)")
    session.run("pytest", *session.posargs)


@nox.session
@nox.parametrize("line", list(SQLALCHEMY_LINES))
def direct_sqlalchemy(session: nox.Session, line: str) -> None:
    """The SQLAlchemy internals the direct enqueue paths read (``tests/test_direct.py``, and
    ``tests/test_direct_commit.py`` for the Engine form) and one-job enqueue, on one supported
    minor line: ``nox -s "direct_sqlalchemy(line='2.1')"``."""
    session.install(".[test]", SQLALCHEMY_LINES[line])
    session.run("python", "-c", "import sqlalchemy; print('SQLAlchemy', sqlalchemy.__version__)")
    session.run(
        "pytest",
        "tests/test_direct.py",
        "tests/test_direct_commit.py",
        "tests/test_enqueue.py",
        *session.posargs,
    )


@nox.session
def lint(session: nox.Session) -> None:
    """ruff: lint rules and formatting, as configured in pyproject.toml."""
    session.install("ruff>=0.5")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy --strict over the files pyproject.toml names, and this noxfile."""
    session.install(".[test]", "mypy>=1.10", "types-croniter", "nox")
    session.run("mypy")
    session.run("mypy", "noxfile.py")


@nox.session
def docs(session: nox.Session) -> None:
    """Build the documentation site from scratch with warnings as errors (``-W``) and every
    cross-reference resolved (``-n``), then check the links between its pages (``linkcheck``;
    URLs outside the site are not fetched). The site lands in ``docs/_build/html``."""
    session.install("-e", ".[docs]")
    build = ROOT / "docs" / "_build"
    shutil.rmtree(build, ignore_errors=True)
    session.run(
        "sphinx-build", "-W", "-n", "--keep-going", "-b", "html", "docs", str(build / "html")
    )
    session.run(
        "sphinx-build", "-W", "-n", "-q", "-b", "linkcheck", "docs", str(build / "linkcheck")
    )


@nox.session
def wheel(session: nox.Session) -> None:
    """Build the wheel, install it in a clean virtualenv, and migrate SQLite, PostgreSQL and
    MariaDB with its ``sqlqueue`` command, twice each (the second run finds nothing to do)."""
    tmp = Path(session.create_tmp()).resolve()
    dist, clean, scratch = tmp / "dist", tmp / "clean-venv", tmp / "scratch"
    for path in (dist, clean, scratch):
        shutil.rmtree(path, ignore_errors=True)
    scratch.mkdir()

    session.run("python", "-m", "pip", "wheel", str(ROOT), "--no-deps", "--wheel-dir", str(dist))
    (built,) = dist.glob("sqlalchemy_sqlqueue-*.whl")

    session.run("python", "-m", "venv", str(clean))
    python = _executable(clean, "python")
    session.run(
        str(python), "-m", "pip", "install", "-q", f"{built}[postgres,mysql]", external=True
    )

    with session.chdir(scratch):
        # From outside the checkout, so nothing can come from the source tree.
        location = session.run(
            str(python),
            "-c",
            "import sqlqueue; print(sqlqueue.__file__)",
            external=True,
            silent=True,
        )
        if not str(location).strip().startswith(str(clean)):
            session.error(f"sqlqueue was imported from {location!r}, not from the clean venv")

        cli = str(_executable(clean, "sqlqueue"))
        sqlite_url = f"sqlite:///{scratch / 'x.db'}"
        for _ in range(2):  # the second run finds the schema up to date
            session.run(cli, "migrate", "--database-url", sqlite_url, external=True)
        _check_tables(session, sqlite_url)

        for admin_url in (POSTGRES_URL, MYSQL_URL):
            with _scratch_database(session, admin_url) as url:
                # Through the environment, so a password in the URL stays out of the log.
                for _ in range(2):
                    session.run(cli, "migrate", env={"SQLQUEUE_DATABASE_URL": url}, external=True)
                _check_tables(session, url)


@nox.session
def bench(session: nox.Session) -> None:
    """sqlqueue against raw SQL on SQLite, PostgreSQL and MariaDB, printed as one table.

    Arguments go to ``python -m bench``: ``nox -s bench -- --quick``,
    ``nox -s bench -- --json new.json --compare old.json``.
    """
    session.install(".[postgres,mysql]")
    session.run("python", "-m", "bench", *session.posargs)


@nox.session
def bench_compare(session: nox.Session) -> None:
    """Two revisions' drain and enqueue figures, interleaved, each B/A with its spread; a change
    beyond 5 % in every round is flagged (exit 3 when worse). Before a change to the claim,
    completion or enqueue path is resolved (docs/development.md).

    Arguments go to ``python -m bench compare``: ``nox -s bench_compare -- main`` (the working
    tree against main), ``-- HEAD~1 HEAD --rounds 3 --backends postgresql``. Each revision gets
    a virtualenv of its own (bench/compare_envs.py), so this one needs no sqlqueue.
    """
    session.run("python", "-m", "bench", "compare", *session.posargs)


@nox.session
def bench_peers(session: nox.Session) -> None:
    """sqlqueue next to pgqueuer, procrastinate and raw SQL on PostgreSQL, one table.

    Arguments go to ``python -m bench --peers``: ``nox -s bench_peers -- --runs 1``,
    ``-- --in-flight 10,100,1000 --json peers.json``.
    """
    session.install(".[bench]")
    session.run("python", "-m", "bench", "--peers", *session.posargs)


@nox.session
def mvcc(session: nox.Session) -> None:
    """sqlqueue, pgqueuer and raw SQL on PostgreSQL while a transaction holds the xmin horizon
    for 10 minutes: claim latency, throughput, sizes and dead tuples every 10 s, a table and a
    plot in bench/results/.

    Arguments go to ``python -m bench --only mvcc``: ``nox -s mvcc -- --mvcc-minutes 3``,
    ``-- --mvcc-systems sqlqueue,sqlqueue-nofloor,raw,raw-floor --mvcc-rate 100``.
    """
    session.install(".[bench]")
    session.run("python", "-m", "bench", "--only", "mvcc", *session.posargs)


@nox.session
def bench_operations(session: nox.Session) -> None:
    """stats, health, jobs pages, mass requeue and a first prune on 1,000,000 finished jobs.

    Arguments go to ``python -m bench.operations``: ``nox -s bench_operations -- --plans``,
    ``-- --rows 100000 --backends sqlite``.
    """
    session.install(".[postgres,mysql]")
    session.run("python", "-m", "bench.operations", *session.posargs)


@nox.session
def bench_prune(session: nox.Session) -> None:
    """A worker's round trips alone and during a first prune of 1,000,000 finished jobs.

    Arguments go to ``python -m bench.prune``: ``nox -s bench_prune -- --alone``,
    ``-- --rows 200000 --backends sqlite``.
    """
    session.install(".[postgres]")
    session.run("python", "-m", "bench.prune", *session.posargs)


@nox.session
def bench_prune_history(session: nox.Session) -> None:
    """PostgreSQL's history table: moving 1,000,000 succeeded jobs into it, then the first prune
    (whole days dropped), each beside a worker's round trips.

    Arguments go to ``python -m bench.prune_history``: ``nox -s bench_prune_history -- --rows
    200000``.
    """
    session.install(".[postgres]")
    session.run("python", "-m", "bench.prune_history", *session.posargs)


@nox.session
def bench_report(session: nox.Session) -> None:
    """The activity report over 1,000,000 events: chunked in a batch vs one job, RSS and time.

    Arguments go to ``python -m bench.activity_report``: ``nox -s bench_report -- --events
    100000 --backends sqlite``.
    """
    session.install(".[test]")
    session.run("python", "-m", "bench.activity_report", *session.posargs)


@nox.session
def coverage(session: nox.Session) -> None:
    """Line and branch coverage of ``sqlqueue/`` over the suite on SQLite, PostgreSQL and
    MariaDB, worker and CLI subprocesses included (``[tool.coverage]`` in pyproject.toml).
    The pytest-xdist workers of ``addopts`` are such subprocesses too: coverage's
    ``patch = ["subprocess"]`` measures them, and ``coverage combine`` joins their files.

    Pass pytest arguments after ``--``: ``nox -s coverage -- tests/test_worker.py``. The report
    lists the least covered modules first; ``htmlcov/index.html`` shows the missed lines.
    """
    session.install("-e", ".[test]", "coverage[toml]>=7.10")
    session.run("coverage", "erase")
    backends = os.environ.get("SQLQUEUE_TEST_BACKENDS", "sqlite,postgresql,mysql")
    try:
        session.run(
            "coverage",
            "run",
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            *session.posargs,
            env={"SQLQUEUE_TEST_BACKENDS": backends},
        )
    finally:
        session.run("coverage", "combine", "--quiet")
        session.run("coverage", "html", "--quiet")
        session.run("coverage", "report")


@nox.session
def bench_smoke(session: nox.Session) -> None:
    """The benchmark harness end to end at a small size (``tests/test_bench_smoke.py``, marked
    ``bench_smoke``, not in the default suite): run it before a change to the bench or to the
    claim, completion or enqueue path is resolved."""
    session.install(".[test]")
    session.run("pytest", "-m", "bench_smoke", "tests/test_bench_smoke.py", *session.posargs)


@nox.session
def independent(session: nox.Session) -> None:
    """The tests marked ``backend_independent`` (a browser, SMTP, email headers) on every
    backend, not only the first: run it when a change might make one of them depend on the
    database (``tests/test_backend_independence.py`` says what such a test may not do)."""
    session.install(".[test]")
    session.run(
        "pytest",
        "-m",
        "backend_independent",
        *session.posargs,
        env={"SQLQUEUE_TEST_EVERY_BACKEND": "1"},
    )


@nox.session
def slow(session: nox.Session) -> None:
    """The long-running tests marked ``slow``: the fault suite at 20 times its CI size (pass
    pytest arguments after ``--``)."""
    session.install(".[test]")
    session.run("pytest", "-m", "slow", *session.posargs)


@nox.session
def soak(session: nox.Session) -> None:
    """30 minutes of a steady mix (enqueue, drain, 5 % failing, retention on) on PostgreSQL and
    SQLite at once, after a 5-minute warm-up (sampled, not judged): throughput, pickup p99,
    table size, dead tuples and worker RSS each minute, checked (the last 5 minutes against the
    first 5) and written to bench/results/.

    Arguments go to ``python -m bench.soak``: ``nox -s soak -- --minutes 5``,
    ``-- --rate 200 --backends postgresql``.
    """
    session.install(".[bench]")
    session.run("python", "-m", "bench.soak", *session.posargs)


def _executable(venv: Path, name: str) -> Path:
    """A program installed in ``venv``, on POSIX or Windows."""
    if sys.platform == "win32":
        return venv / "Scripts" / f"{name}.exe"
    return venv / "bin" / name


@contextmanager
def _scratch_database(session: nox.Session, admin_url: str) -> Iterator[str]:
    """A new, empty database on the test server at ``admin_url`` (PostgreSQL or MariaDB),
    dropped afterwards; yields its URL."""
    import sqlalchemy as sa

    admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
    name = f"sqlqueue_wheel_{secrets.token_hex(4)}"
    force = " WITH (FORCE)" if admin.dialect.name == "postgresql" else ""
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f"CREATE DATABASE {conn.dialect.identifier_preparer.quote(name)}")
    except sa.exc.OperationalError as error:
        admin.dispose()
        variable = "POSTGRES" if admin.dialect.name == "postgresql" else "MYSQL"
        session.error(
            f"{admin.url.render_as_string()} is unreachable ({error.orig}); start it or set "
            f"SQLQUEUE_TEST_{variable}_URL"
        )
    try:
        yield sa.make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            quoted = conn.dialect.identifier_preparer.quote(name)
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {quoted}{force}")
        admin.dispose()


def _check_tables(session: nox.Session, url: str) -> None:
    """Fail the session unless ``url`` has sqlqueue's tables and one recorded revision."""
    import sqlalchemy as sa

    engine = sa.create_engine(url)
    try:
        tables = set(sa.inspect(engine).get_table_names())
        missing = SQLQUEUE_TABLES - tables
        if missing:
            session.error(f"{engine.url!r} lacks {sorted(missing)}")
        version = sa.table("sqlqueue_alembic_version", sa.column("version_num"))
        with engine.connect() as conn:
            revisions = list(conn.execute(sa.select(version.c.version_num)).scalars())
    finally:
        engine.dispose()
    if len(revisions) != 1:
        session.error(f"{engine.url!r} should record one revision, has {revisions}")
    session.log(f"{engine.url!r}: tables {sorted(tables)}, revision {revisions[0]}")
