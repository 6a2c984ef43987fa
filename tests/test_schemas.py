"""sqlqueue's tables in named PostgreSQL schemas: two queues in schemas ``a`` and ``b`` of one
database share nothing — jobs, pauses, counts, gates, webhook endpoints, the email ledger,
wake-ups — and the default schema (``public``) gets no table at all. Where the database has no
schemas (SQLite), asking for one is refused, saying what to do instead.

Each test starts from a database whose default schema holds no sqlqueue table, so a statement
that missed the schema fails loudly instead of quietly using the default schema's tables.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import sqlqueue
from sqlqueue._schema import SCHEMA_REVISION, VERSION_TABLE, history_metadata, metadata
from sqlqueue._store.bulk_copy import COPY_MIN_ROWS
from sqlqueue.dialects import dialect_for
from sqlqueue.email import SMTP, Content, Mailer
from sqlqueue.webhooks import UnknownEndpoint, Webhooks
from tests._support import drain, run_cli
from tests.apps.processes import Workers, wait_until
from tests.apps.receiver import Reply, running_receiver
from tests.apps.schema_notes import NOTES
from tests.conftest import Backend
from tests.smtp_server import SMTPServer

pytestmark = pytest.mark.timeout(180)

SCHEMA_APP = "tests.apps.schema_app:queue"
#: Every table of a schema on PostgreSQL (which keeps the finished history's table too).
SQLQUEUE_TABLES = {
    table.name for table in (*metadata.tables.values(), *history_metadata.tables.values())
} | {VERSION_TABLE}


def cli(*args: str, url: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``python -m sqlqueue ARGS`` on ``url`` (no schema from our own environment)."""
    return run_cli(*args, url=url, env=env)


def cli_json(*args: str, url: str, **env: str) -> Any:
    """A command's ``--json`` output, which must have succeeded."""
    done = cli(*args, "--json", url=url, **env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def tables_in(engine: sa.Engine, schema: str) -> set[str]:
    with engine.connect() as conn:
        return set(sa.inspect(conn).get_table_names(schema=schema))


def indexes_in(engine: sa.Engine, schema: str) -> set[tuple[str, str]]:
    query = sa.text("SELECT tablename, indexname FROM pg_indexes WHERE schemaname = :schema")
    with engine.connect() as conn:
        return {(row[0], row[1]) for row in conn.execute(query, {"schema": schema})}


def rows_of(engine: sa.Engine, schema: str, table: str) -> int:
    with engine.connect() as conn:
        quoted = f'"{schema}"."{table}"'
        return int(conn.exec_driver_sql(f"SELECT count(*) FROM {quoted}").scalar_one())


def _drop_sqlqueue(engine: sa.Engine) -> None:
    """No sqlqueue table in ``public``, no schema ``a``, ``b`` or ``c``."""
    with engine.begin() as conn:
        for schema in ("a", "b", "c"):
            conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        for table in SQLQUEUE_TABLES | {NOTES.name}:
            conn.exec_driver_sql(f'DROP TABLE IF EXISTS public."{table}" CASCADE')


@pytest.fixture
def two_schemas(backend: Backend) -> Iterator[Backend]:
    """``backend`` (with schemas) whose sqlqueue tables are in schemas ``a`` and ``b`` only:
    ``a`` migrated by the command, ``b`` by ``sqlqueue.migrate``."""
    backend.requires("schemas")
    _drop_sqlqueue(backend.engine)
    try:
        done = cli("migrate", "--schema", "a", url=backend.url)
        assert done.returncode == 0, done.stderr
        assert done.stdout.endswith(" (schema 'a')\n"), done.stdout
        sqlqueue.migrate(backend.engine, schema="b")
        yield backend
    finally:
        _drop_sqlqueue(backend.engine)


def in_schema(backend: Backend, schema: str, **options: Any) -> sqlqueue.Queue:
    """A queue on the tables of ``schema``, with the tasks of the schema app."""
    queue = sqlqueue.Queue(backend.engine, schema=schema, **options)

    @queue.task("note", queue="notes")
    def note(label: str) -> None:
        return None

    @queue.task("doomed", queue="notes", max_attempts=1)
    def doomed(label: str) -> None:
        raise RuntimeError(f"doomed {label}")

    return queue


# -- where there are no schemas ---------------------------------------------------------------


def test_a_database_without_schemas_refuses_one_saying_what_to_do(backend, tmp_path):
    if backend.capable("schemas"):
        pytest.skip(f"{backend.name} has schemas")
    with pytest.raises(sqlqueue.UnsupportedDatabase, match="database of its own"):
        sqlqueue.Queue(backend.engine, schema="a")
    with pytest.raises(sqlqueue.UnsupportedDatabase, match="has no schemas"):
        sqlqueue.migrate(backend.engine, schema="a")
    for command in (["migrate"], ["stats"], ["dead", "list"]):
        done = cli(*command, "--schema", "a", url=backend.url)
        assert done.returncode == 2, done.stderr
        assert "--schema" in done.stderr
        assert "has no schemas" in done.stderr
        assert "Traceback" not in done.stderr
    done = cli("worker", SCHEMA_APP, "--schema", "a", "--burst", url=backend.url)
    assert done.returncode == 2, done.stderr
    assert "has no schemas" in done.stderr


# -- migrations -------------------------------------------------------------------------------


def test_each_schema_gets_every_table_and_its_own_version_table_and_public_none(two_schemas):
    engine = two_schemas.engine
    assert tables_in(engine, "a") == SQLQUEUE_TABLES
    assert tables_in(engine, "b") == SQLQUEUE_TABLES
    assert not tables_in(engine, "public") & SQLQUEUE_TABLES
    assert indexes_in(engine, "a") == indexes_in(engine, "b")
    assert not {name for _, name in indexes_in(engine, "public")} & {
        name for _, name in indexes_in(engine, "a")
    }
    for schema in ("a", "b"):
        with engine.connect() as conn:
            versions = conn.exec_driver_sql(
                f'SELECT version_num FROM "{schema}".{VERSION_TABLE}'
            ).all()
        assert versions == [(SCHEMA_REVISION,)]
        assert sqlqueue.Queue(engine, schema=schema).admin.schema_revision() == SCHEMA_REVISION
    assert sqlqueue.Queue(engine).admin.schema_revision() is None


def test_migrating_a_schema_again_changes_nothing(two_schemas):
    engine = two_schemas.engine
    before = (tables_in(engine, "a"), indexes_in(engine, "a"))
    queue = in_schema(two_schemas, "a")
    with engine.begin() as conn:
        job_id = queue.enqueue(conn, "note", {"label": "kept"})
    done = cli("migrate", "--schema", "a", url=two_schemas.url)
    assert done.returncode == 0, done.stderr
    sqlqueue.migrate(engine, schema="a")
    with engine.connect() as conn, conn.begin():
        path = conn.exec_driver_sql("SHOW search_path").scalar_one()
        sqlqueue.migrate(conn, schema="a")  # inside the caller's transaction
        # The caller's search_path is as it was: its own tables resolve as before.
        assert conn.exec_driver_sql("SHOW search_path").scalar_one() == path
        assert conn.exec_driver_sql("SELECT current_schema()").scalar_one() == "public"
    assert (tables_in(engine, "a"), indexes_in(engine, "a")) == before
    assert rows_of(engine, "a", VERSION_TABLE) == 1
    assert queue.get_job(job_id) is not None
    assert not tables_in(engine, "public") & SQLQUEUE_TABLES


def test_a_schema_never_migrated_names_the_command_that_creates_it(two_schemas):
    queue = in_schema(two_schemas, "c")
    with pytest.raises(sqlqueue.SchemaNotMigrated, match="sqlqueue migrate --schema c"):
        queue.stats()
    with (
        pytest.raises(sqlqueue.SchemaNotMigrated, match="sqlqueue migrate --schema c"),
        two_schemas.engine.begin() as conn,
    ):
        queue.enqueue(conn, "note", {"label": "nowhere"})
    done = cli("stats", "--schema", "c", url=two_schemas.url)
    assert done.returncode == 3
    assert "schema 'c' has no sqlqueue tables" in done.stderr
    assert "sqlqueue migrate --schema c" in done.stderr


# -- workers ----------------------------------------------------------------------------------


def test_worker_processes_in_two_schemas_run_only_their_own_jobs(two_schemas, tmp_path: Path):
    engine = two_schemas.engine
    NOTES.create(engine)  # the app's own table, in the default schema
    queue_a, queue_b = in_schema(two_schemas, "a"), in_schema(two_schemas, "b")
    with engine.begin() as conn:
        # COPY (a batch this large), multi-row INSERTs with keys, and one-row INSERTs.
        many = [
            sqlqueue.JobRequest(job_type="note", payload={"label": f"a{i}"})
            for i in range(COPY_MIN_ROWS)
        ]
        ids_a = queue_a.enqueue_many(conn, many)
        ids_a.append(queue_a.enqueue(conn, "note", {"label": "a-one"}))
        ids_b = queue_b.enqueue_many(
            conn,
            [
                sqlqueue.JobRequest(
                    job_type="note", payload={"label": f"b{i}"}, idempotency_key=f"b{i}"
                )
                for i in range(5)
            ],
        )
        ids_b.append(queue_b.enqueue(conn, "note", {"label": "b-one"}, idempotency_key="b0"))
    assert ids_b[-1] == ids_b[0]  # the key is known in b's table
    workers = Workers(two_schemas.url, tmp_path)
    try:
        for schema in ("a", "b"):
            workers.start("--schema", schema, "--poll-interval", "0.05", app=SCHEMA_APP)
        expected = {"a": len(set(ids_a)), "b": len(set(ids_b))}
        wait_until(
            lambda: (
                {
                    schema: q.stats().by_status["succeeded"]
                    for schema, q in (("a", queue_a), ("b", queue_b))
                }
                == expected
            ),
            timeout=60,
            what="both schemas' jobs to succeed",
        )
    finally:
        workers.close()
    with engine.connect() as conn:
        notes = conn.execute(sa.select(NOTES)).all()
    by_schema = {
        schema: {(row.job_id, row.label) for row in notes if row.schema == schema}
        for schema in ("a", "b")
    }
    assert len(notes) == len(set(ids_a)) + len(set(ids_b))
    assert {job_id for job_id, _ in by_schema["a"]} == set(ids_a)
    assert {job_id for job_id, _ in by_schema["b"]} == set(ids_b)
    assert all(label.startswith("a") for _, label in by_schema["a"])
    assert all(label.startswith("b") for _, label in by_schema["b"])
    assert not tables_in(engine, "public") & SQLQUEUE_TABLES


def test_a_schemas_workers_are_woken_by_its_own_enqueues_only(two_schemas):
    engine = two_schemas.engine
    queue_a, queue_b = in_schema(two_schemas, "a"), in_schema(two_schemas, "b")
    assert queue_a.dialect.wake_channel != queue_b.dialect.wake_channel
    with queue_a.dialect.listen(engine, queue_a.dialect.wake_channel) as wait:
        with engine.begin() as conn:
            queue_b.enqueue(conn, "note", {"label": "b"}, queue="from_b")
            queue_b.pause("from_b", by="test", reason="a pause in b")
        with engine.begin() as conn:
            queue_a.enqueue(conn, "note", {"label": "a"}, queue="from_a")
        heard: list[str] = []
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            heard.extend(wait(0.1))
    assert heard == ["from_a"]


# -- operators --------------------------------------------------------------------------------


def test_the_operators_commands_with_a_schema_see_only_its_jobs(two_schemas):
    engine, url = two_schemas.engine, two_schemas.url
    queue_a, queue_b = in_schema(two_schemas, "a"), in_schema(two_schemas, "b")
    with engine.begin() as conn:
        dead_a = [queue_a.enqueue(conn, "doomed", {"label": f"a{i}"}) for i in range(2)]
        dead_b = [queue_b.enqueue(conn, "doomed", {"label": f"b{i}"}) for i in range(3)]
    drain(queue_a)
    drain(queue_b)
    with engine.begin() as conn:
        waiting = queue_b.enqueue(conn, "note", {"label": "b-waiting"})

    stats_a = cli_json("stats", "--schema", "a", url=url)
    stats_b = cli_json("stats", url=url, SQLQUEUE_SCHEMA="b")
    assert stats_a["by_status"]["dead"] == 2
    assert stats_a["by_status"]["queued"] == 0
    assert stats_b["by_status"]["dead"] == 3
    assert stats_b["by_status"]["queued"] == 1

    listed_a = cli_json("jobs", "list", "--schema", "a", url=url)
    assert {job["id"] for job in listed_a} == set(dead_a)
    dead_listed_b = cli_json("dead", "list", "--schema", "b", url=url)
    assert {job["id"] for job in dead_listed_b} == set(dead_b)

    requeued = cli_json(
        "dead", "requeue", "--schema", "a", "--all", "--by", "ops", "--reason", "fixed", url=url
    )
    assert len(requeued["requeued"]) == 2
    assert {job.id for job in queue_a.jobs(status="queued")} == set(requeued["requeued"])
    assert queue_b.stats().by_status["dead"] == 3
    assert {job.id for job in queue_b.jobs(status="dead", unhandled=True)} == set(dead_b)
    assert [job.id for job in queue_b.jobs(status="queued")] == [waiting]

    done = cli("pause", "notes", "--schema", "b", "--by", "ops", "--reason", "hold", url=url)
    assert done.returncode == 0, done.stderr
    assert queue_b.stats().queues["notes"].paused
    assert "notes" not in queue_a.admin.paused_queues()
    drain(queue_a)  # a's requeued jobs run (and die again): b's pause is not a's
    assert queue_a.stats().by_status["queued"] == 0
    assert queue_b.get_job(waiting).status == "queued"  # type: ignore[union-attr]

    done = cli("stats", url=url)  # the default schema has no sqlqueue tables
    assert done.returncode == 3
    assert "sqlqueue migrate" in done.stderr


# -- the kinds and the gates ------------------------------------------------------------------


def test_webhook_endpoints_gates_and_the_email_ledger_stay_in_their_schema(two_schemas):
    engine = two_schemas.engine
    queue_a, queue_b = in_schema(two_schemas, "a"), in_schema(two_schemas, "b")
    hooks_a = Webhooks(queue_a, allow_private_addresses=True)
    hooks_b = Webhooks(queue_b, allow_private_addresses=True)
    smtp = SMTPServer()
    with running_receiver() as receiver, smtp.running() as port:
        mailer = Mailer(
            queue_a, smtp=SMTP(host="127.0.0.1", port=port, starttls=False), sender="a@example.com"
        )

        @mailer.template("hello", version="1")
        def hello(name: str) -> Content:
            return Content(subject=f"Hello {name}", text=f"Hello {name}")

        receiver.script("/crm", Reply(status=200))
        with engine.begin() as conn:
            hooks_a.add_endpoint(conn, name="crm", url=receiver.url("/crm"))
            assert [endpoint.name for endpoint in hooks_a.endpoints(conn)] == ["crm"]
            assert hooks_b.endpoints(conn) == []
            with pytest.raises(UnknownEndpoint):
                hooks_b.deliver(conn, endpoint="crm", event_type="user.created", data={})
        with engine.begin() as conn:
            delivery = hooks_a.deliver(conn, endpoint="crm", event_type="user.created", data={})
            mail = mailer.send(
                conn, to=["ada@example.com"], template="hello", context={"name": "Ada"}
            )
        drain(queue_a)
        assert len(receiver.received("/crm")) == 1
        assert len(smtp.received) == 1
    for job_id in (delivery, mail):
        assert queue_a.get_job(job_id).status == "succeeded"  # type: ignore[union-attr]
    assert queue_b.get_job(delivery) is None
    for table in ("sqlqueue_email_sent", "sqlqueue_webhook_endpoints", "sqlqueue_rate_limits"):
        assert rows_of(engine, "a", table) >= 1, table
        assert rows_of(engine, "b", table) == 0, table
    assert rows_of(engine, "b", "sqlqueue_circuit_breakers") == 0


def test_the_dialect_qualifies_only_sqlqueues_statements(two_schemas):
    """The schema travels with sqlqueue's statements, never on the caller's connection."""
    engine = two_schemas.engine
    queue = in_schema(two_schemas, "a")
    with engine.connect() as conn:
        with conn.begin():
            queue.enqueue(conn, "note", {"label": "x"})
            assert "schema_translate_map" not in conn.get_execution_options()
        assert conn.exec_driver_sql("SELECT current_schema()").scalar_one() == "public"
    assert queue.engine is engine
    assert dialect_for(engine).schema is None
    assert "schema_translate_map" not in engine.get_execution_options()


def test_batches_their_fan_out_and_callbacks_stay_in_their_schema(two_schemas):
    engine = two_schemas.engine
    queue_a, queue_b = in_schema(two_schemas, "a"), in_schema(two_schemas, "b")
    seen: list[tuple[int, int]] = []

    @queue_a.task("fan", queue="notes")
    def fan(ctx: sqlqueue.JobContext) -> None:  # the handler's own transaction: no translate map
        ctx.add_to_batch([sqlqueue.JobRequest(job_type="note", payload={"label": "added"})])

    @queue_a.task("summary", queue="notes")
    def summary(ctx: sqlqueue.JobContext) -> None:
        batch = ctx.batch
        assert batch is not None
        seen.append((batch.total, batch.succeeded))

    with engine.begin() as conn:
        batch = queue_a.enqueue_batch(
            conn,
            [sqlqueue.JobRequest(job_type="fan"), sqlqueue.JobRequest(job_type="doomed",
                                                                      payload={"label": "x"})],
            on_complete=sqlqueue.JobRequest(job_type="summary"),
        )  # fmt: skip
    assert queue_b.get_batch(batch.id) is None
    drain(queue_a)
    assert seen == [(3, 2)]
    status = queue_a.get_batch(batch.id)
    assert status is not None
    assert (status.total, status.succeeded, status.dead) == (3, 2, 1)
    assert rows_of(engine, "a", "sqlqueue_batches") == 1
    assert rows_of(engine, "b", "sqlqueue_batches") == 0
    assert rows_of(engine, "b", "sqlqueue_jobs") == 0
