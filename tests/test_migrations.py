"""Migrations: the migrated schema is exactly the declared one, sqlqueue's history lives in its
own version table beside a host's, the CLI migrates, and the wheel carries the revisions."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from datetime import timedelta
from pathlib import Path
from typing import Any

import alembic
import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory

import sqlqueue
from sqlqueue._migrate import migrations_dir
from sqlqueue._schema import SCHEMA_REVISION, VERSION_TABLE, history_metadata, metadata
from tests._support import db_now, run_cli

ROOT = Path(__file__).resolve().parents[1]
HEAD = ScriptDirectory(str(migrations_dir())).get_current_head()
UNREACHABLE_POSTGRES = "postgresql+psycopg://postgres@127.0.0.1:1/sqlqueue"


def _drop_sqlqueue(engine: sa.Engine) -> None:
    """Remove sqlqueue's tables and version table, leaving anything else in place."""
    metadata.drop_all(engine)
    sa.Table(VERSION_TABLE, sa.MetaData()).drop(engine, checkfirst=True)


def _versions(engine: sa.Engine, table: str) -> list[str]:
    version = sa.table(table, sa.column("version_num"))
    with engine.connect() as conn:
        return list(conn.execute(sa.select(version.c.version_num)).scalars())


def _tables(engine: sa.Engine) -> set[str]:
    return set(sa.inspect(engine).get_table_names())


def _plain(value: Any) -> Any:
    """Reflected values made comparable: types and SQL fragments as text, dicts sorted."""
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in sorted(value.items())}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    if isinstance(value, sa.types.TypeEngine):
        return repr(value)
    if isinstance(value, sa.sql.ClauseElement):
        return str(value)
    return value


def _index_names(engine: sa.Engine, table: str) -> list[str]:
    """Every index on ``table`` by name, from the database's own catalog: the inspector skips
    SQLite's indexes on expressions, which a table rebuild (alembic's batch mode) would lose."""
    catalog = {
        "sqlite": "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = :t",
        "postgresql": "SELECT indexname FROM pg_indexes WHERE tablename = :t "
        "AND schemaname = current_schema()",
    }
    query = catalog.get(
        engine.dialect.name,
        "SELECT DISTINCT index_name FROM information_schema.statistics WHERE table_name = :t "
        "AND table_schema = DATABASE()",
    )
    with engine.connect() as conn:
        return sorted(str(name) for name in conn.execute(sa.text(query), {"t": table}).scalars())


def _snapshot(engine: sa.Engine) -> dict[str, Any]:
    """Everything the database reports about sqlqueue's tables, as the database spells it."""
    inspector = sa.inspect(engine)
    return {
        table: _plain(
            {
                "columns": inspector.get_columns(table),
                "primary_key": inspector.get_pk_constraint(table),
                "indexes": {ix["name"]: ix for ix in inspector.get_indexes(table)},
                "checks": {ck["name"]: ck for ck in inspector.get_check_constraints(table)},
                "uniques": inspector.get_unique_constraints(table),
                "foreign_keys": inspector.get_foreign_keys(table),
                "index_names": _index_names(engine, table),
            }
        )
        for table in sorted(inspector.get_table_names())
        if table != VERSION_TABLE
    }


# -- the migrated schema is the declared schema ---------------------------------------------


def test_the_schema_revision_the_code_expects_is_the_newest_migration():
    assert SCHEMA_REVISION == HEAD


def test_alembic_sees_no_difference_between_migrations_and_metadata(backend):
    with backend.engine.connect() as conn:
        # version_table tells alembic which table is the version table: it skips that one, as
        # it would skip `alembic_version`, instead of reporting it as a table to drop.
        context = MigrationContext.configure(
            conn,
            opts={
                "version_table": VERSION_TABLE,
                "compare_type": True,
                "include_object": _created_on(conn.dialect.name),
            },
        )
        # The finished history's table exists only where the backend keeps one (0020).
        declared: Any = (
            [metadata, history_metadata] if backend.capable("history_partitions") else metadata
        )
        assert compare_metadata(context, declared) == []


def _created_on(dialect: str) -> Any:
    """Alembic's filter for objects that exist on ``dialect``: alembic compares objects
    declared for one backend only (``ddl_if``, e.g. a MySQL-only index) on every backend."""

    def include(obj: Any, _name: Any, _type: Any, _reflected: Any, _compare_to: Any) -> bool:
        only = getattr(obj, "_ddl_if", None)
        return only is None or only.dialect is None or dialect in only.dialect

    return include


def test_migrated_schema_equals_create_all_including_checks_and_partial_indexes(backend):
    # Alembic's autogenerate compares tables, columns, types, nullability, keys and indexes, but
    # neither CHECK constraints nor the WHERE of a partial index. So also let the database
    # describe the migrated schema and the one create_all() builds from the metadata, and
    # compare the two descriptions whole: both are spelled by the same server.
    migrated = _snapshot(backend.engine)
    _drop_sqlqueue(backend.engine)
    metadata.create_all(backend.engine)
    declared = _snapshot(backend.engine)

    assert migrated == declared
    # The comparison covers what alembic skips: reflection did report both kinds.
    table = migrated["sqlqueue_jobs"]
    assert set(table["checks"]) == {
        "ck_sqlqueue_jobs_status",
        "ck_sqlqueue_jobs_max_attempts",
        "ck_sqlqueue_jobs_attempts",
    }
    # 0014's index on an expression (SQLite), which reflection skips, went in 0019.
    assert "ix_sqlqueue_jobs_unhandled_errors" not in table["index_names"]
    if not backend.capable("partial_indexes"):  # MySQL: full indexes, compared above
        return
    for name in ("ix_sqlqueue_jobs_claim", "ix_sqlqueue_jobs_lease"):
        options = table["indexes"][name]["dialect_options"]
        assert any(key.endswith("_where") and value for key, value in options.items()), options


# -- idempotent, and in a version table of its own -------------------------------------------


def test_migrate_is_idempotent_and_records_its_revision_in_its_own_table(backend):
    queue = backend.queue()
    queue.task("noop")(lambda: None)
    with backend.engine.begin() as conn:
        job_id = queue.enqueue(conn, "noop", {})

    sqlqueue.migrate(backend.engine)
    sqlqueue.migrate(backend.url)
    with backend.engine.connect() as conn:
        sqlqueue.migrate(conn)

    assert _versions(backend.engine, VERSION_TABLE) == [HEAD]
    assert "alembic_version" not in _tables(backend.engine)
    job = queue.get_job(job_id)
    assert job is not None
    assert job.status == sqlqueue.JobStatus.QUEUED


def test_a_host_apps_alembic_history_is_untouched(backend):
    _drop_sqlqueue(backend.engine)
    host = sa.MetaData()
    host_version = sa.Table(
        "alembic_version", host, sa.Column("version_num", sa.String(32), primary_key=True)
    )
    sa.Table("host_users", host, sa.Column("id", sa.Integer, primary_key=True))
    host.create_all(backend.engine)
    with backend.engine.begin() as conn:
        conn.execute(host_version.insert().values(version_num="hostrev123"))

    # Had sqlqueue used `alembic_version`, alembic would fail here: no revision "hostrev123".
    sqlqueue.migrate(backend.engine)
    sqlqueue.migrate(backend.engine)

    assert _versions(backend.engine, "alembic_version") == ["hostrev123"]
    assert _versions(backend.engine, VERSION_TABLE) == [HEAD]
    assert _tables(backend.engine) == {
        "alembic_version",
        "host_users",
        VERSION_TABLE,
        *metadata.tables,
        *(history_metadata.tables if backend.capable("history_partitions") else ()),
    }


def test_a_failed_migration_leaves_nothing_half_done(backend):
    backend.requires("transactional_ddl")
    _drop_sqlqueue(backend.engine)
    # A host object that takes one of our index names makes the revision fail after its
    # CREATE TABLE; the whole revision must roll back (on SQLite too, where the driver leaves
    # DDL outside transactions unless one is begun explicitly).
    host = sa.MetaData()
    things = sa.Table(
        "host_things",
        host,
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("status", sa.String(16)),
    )
    sa.Index("ix_sqlqueue_jobs_status", things.c.status)
    host.create_all(backend.engine)

    with pytest.raises(sqlqueue.SqlqueueError, match="ix_sqlqueue_jobs_status"):
        sqlqueue.migrate(backend.engine)
    assert _tables(backend.engine) == {"host_things"}

    # Inside a caller's transaction the failure is contained too, and the transaction goes on.
    with backend.engine.connect() as conn:
        conn.execute(things.insert().values(status="before"))
        with pytest.raises(sqlqueue.SqlqueueError):
            sqlqueue.migrate(conn)
        conn.execute(things.insert().values(status="after"))
        conn.commit()
    assert _tables(backend.engine) == {"host_things"}
    with backend.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(things)).scalar() == 2


# -- a host's alembic env.py runs ours (the recipe in docs/migrations.md) --------------------

HOST_ENV = '''
import sqlalchemy as sa
from alembic import context

import sqlqueue

host = sa.MetaData()
sa.Table("host_users", host, sa.Column("id", sa.Integer, primary_key=True))


def include_name(name, type_, parent_names):
    """Leave sqlqueue's tables (and its version table) to sqlqueue's own migrations."""
    if type_ == "table":
        return not name.startswith("sqlqueue_")
    return True


engine = sa.create_engine(context.config.get_main_option("sqlalchemy.url"), poolclass=sa.NullPool)
with engine.connect() as connection:
    context.configure(connection=connection, target_metadata=host, include_name=include_name)
    with context.begin_transaction():
        sqlqueue.migrate(connection)
        context.run_migrations()
'''


def test_a_host_alembic_env_runs_sqlqueue_migrations_and_ignores_its_tables(backend, tmp_path):
    _drop_sqlqueue(backend.engine)
    script_dir = tmp_path / "host_migrations"
    (script_dir / "versions").mkdir(parents=True)
    (script_dir / "env.py").write_text(HOST_ENV)
    template = Path(alembic.__file__).parent / "templates" / "generic" / "script.py.mako"
    (script_dir / "script.py.mako").write_text(template.read_text())
    config = Config()
    config.set_main_option("script_location", str(script_dir))
    config.set_main_option("sqlalchemy.url", backend.url.replace("%", "%%"))

    script = command.revision(config, "host users", autogenerate=True)
    assert isinstance(script, alembic.script.Script)
    generated = Path(script.path).read_text()
    assert "host_users" in generated
    assert "sqlqueue" not in generated

    command.upgrade(config, "head")
    command.check(config)  # raises if autogenerate would touch anything, ours included

    assert _versions(backend.engine, "alembic_version") == [script.revision]
    assert _versions(backend.engine, VERSION_TABLE) == [HEAD]
    assert {"host_users", "sqlqueue_jobs"} <= _tables(backend.engine)


# -- the command line -------------------------------------------------------------------------


def _sqlqueue_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, cwd=cwd, timeout=60)


def test_cli_migrate_creates_the_tables(backend, tmp_path):
    _drop_sqlqueue(backend.engine)

    result = _sqlqueue_cli("migrate", "--database-url", backend.url, cwd=tmp_path)

    assert result.returncode == 0, result.stderr
    assert {"sqlqueue_jobs", VERSION_TABLE} <= _tables(backend.engine)
    assert _versions(backend.engine, VERSION_TABLE) == [HEAD]


def test_concurrent_first_migrations_take_turns(backend, tmp_path):
    """Four ``sqlqueue migrate`` processes on an empty database at once (several hosts'
    deploys): every one succeeds and the schema is migrated exactly once — PostgreSQL's
    advisory lock, SQLite's write lock, MariaDB's named lock (its DDL cannot wait in a
    transaction)."""
    _drop_sqlqueue(backend.engine)
    command = [sys.executable, "-m", "sqlqueue", "migrate", "--database-url", backend.url]
    processes = [
        subprocess.Popen(command, cwd=tmp_path, stderr=subprocess.PIPE, text=True) for _ in range(4)
    ]
    errors = [process.communicate(timeout=120)[1] for process in processes]

    assert [process.returncode for process in processes] == [0, 0, 0, 0], errors
    assert {"sqlqueue_jobs", VERSION_TABLE} <= _tables(backend.engine)
    assert _versions(backend.engine, VERSION_TABLE) == [HEAD]


def test_a_session_lock_is_let_go_only_after_the_version_row_committed(backend):
    """Where DDL commits at once (MariaDB), the migration lock is the session's (``GET_LOCK``):
    the next migrator it lets in must read the newest version, or it runs the last revision
    again ("Duplicate key name", seen with four concurrent first migrations)."""
    if backend.capable("transactional_ddl"):
        pytest.skip(f"{backend.name}'s migration lock ends with its transaction")
    _drop_sqlqueue(backend.engine)
    engine = sa.create_engine(backend.url)
    reader = sa.create_engine(backend.url, isolation_level="READ COMMITTED")
    seen: list[list[str]] = []

    def before(conn, cursor, statement, parameters, context, executemany):
        if "release_lock" in statement.lower():
            seen.append(_versions(reader, VERSION_TABLE))

    sa.event.listen(engine, "before_cursor_execute", before)
    try:
        sqlqueue.migrate(engine)
    finally:
        engine.dispose()
        reader.dispose()
    assert seen == [[HEAD]]


def test_cli_migrate_without_a_database_says_how_to_give_one(tmp_path):
    result = _sqlqueue_cli("migrate", cwd=tmp_path)

    assert result.returncode == 2  # a usage error
    assert "--database-url" in result.stderr
    assert "SQLQUEUE_DATABASE_URL" in result.stderr


def test_cli_migrate_reports_an_unreachable_postgres(tmp_path):
    result = _sqlqueue_cli("migrate", "--database-url", UNREACHABLE_POSTGRES, cwd=tmp_path)

    assert result.returncode == 3  # the database cannot be reached
    assert "cannot reach PostgreSQL" in result.stderr
    assert "Traceback" not in result.stderr


# -- the wheel ---------------------------------------------------------------------------------


def test_the_wheel_ships_the_migrations_and_py_typed(tmp_path):
    build = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from hatchling.build import build_wheel; print(build_wheel(sys.argv[1]))",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert build.returncode == 0, build.stderr

    with zipfile.ZipFile(tmp_path / build.stdout.strip().splitlines()[-1]) as wheel:
        names = set(wheel.namelist())
        entry_points = next(
            wheel.read(name).decode() for name in names if name.endswith("entry_points.txt")
        )
    assert {
        "sqlqueue/_migrations/env.py",
        "sqlqueue/_migrations/script.py.mako",
        "sqlqueue/_migrations/versions/0001_create_jobs.py",
        "sqlqueue/py.typed",
    } <= names
    revisions = (ROOT / "migrations" / "versions").glob("*.py")
    assert {f"sqlqueue/_migrations/versions/{path.name}" for path in revisions} <= names
    assert not [name for name in names if name.endswith(".pyc")]
    assert "sqlqueue = sqlqueue.cli:main" in entry_points
    # The web page's templates and static files travel inside the package.
    web = ROOT / "sqlqueue" / "web"
    shipped = [*web.glob("templates/*"), *web.glob("static/*")]
    assert len(shipped) >= 8
    assert {f"sqlqueue/web/{path.relative_to(web)}" for path in shipped} <= names


def test_0019_counts_in_the_errors_of_the_dead_jobs_the_rollup_already_held(backend):
    # Before 0019 the finished counts' mark had folded these dead jobs; the error rollup starts
    # with them, so the overview's top errors stay exact across the upgrade.
    _drop_sqlqueue(backend.engine)
    sqlqueue.migrate(backend.engine, revision="0018")
    queue = backend.queue()
    queue.task("boom")(lambda: None)
    with backend.engine.begin() as conn:
        ids = [queue.enqueue(conn, "boom") for _ in range(4)]
    from sqlqueue._schema import count_marks as marks
    from sqlqueue._schema import jobs  # unchanged by 0019

    now = db_now(backend.engine)
    long_ago, mark, later = (now + timedelta(days=days) for days in (-3, -2, -1))
    with backend.engine.begin() as conn:
        for job_id, error, finished_at in zip(
            ids,
            ("503 from crm", "503 from crm", "410 Gone", "503 from crm"),
            (long_ago, long_ago, long_ago, later),  # the last one died after the mark
            strict=True,
        ):
            conn.execute(
                jobs.update()
                .where(jobs.c.id == job_id)
                .values(status="dead", last_error=error, finished_at=finished_at)
            )
        conn.execute(jobs.update().where(jobs.c.id == ids[2]).values(discarded_at=long_ago))
        conn.execute(marks.insert().values(name="finished", folded_until=mark))

    sqlqueue.migrate(backend.engine)

    with backend.engine.connect() as conn:
        rolled = conn.execute(sa.text("SELECT error, count FROM sqlqueue_error_counts")).all()
    assert [(bytes(e).decode() if isinstance(e, bytes) else e, n) for e, n in rolled] == [
        ("503 from crm", 2)
    ]
    assert [(e.error, e.count) for e in queue.stats().top_errors] == [("503 from crm", 3)]
