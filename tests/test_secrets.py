"""Secrets at rest: a task's secret fields are encrypted before their row is written, reach the
handler in the clear, and show as ``"***"`` everywhere else — the database (file bytes, a dump,
the raw columns), reads, the CLI, logs, errors, tracebacks and results.

Each test puts a random canary in the secret fields and looks for it where it must not be.
Keys rotate: the first key encrypts, every key decrypts; a job no key opens goes dead saying so.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import shutil
import subprocess
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from cryptography.fernet import Fernet, InvalidToken
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

import sqlqueue
from sqlqueue._schema import batches, jobs
from sqlqueue._secrets import MARKER, SecretKeyMissing, keyring_from, secret_fields_for
from sqlqueue._worker.scheduler import Scheduler
from sqlqueue.dialects import dialect_for
from tests._support import WorkerThread, drain, run_cli
from tests.apps.processes import wait_until
from tests.conftest import Backend

pytestmark = pytest.mark.timeout(180)

KEY_A = Fernet.generate_key().decode()
KEY_B = Fernet.generate_key().decode()


def canary() -> str:
    """A value that cannot be anywhere unless sqlqueue put it there."""
    return f"canary-{secrets.token_hex(12)}"


def canary_number() -> int:
    """A non-string secret: 16 random digits, as a card number would be."""
    return 4_000_000_000_000_000 + secrets.randbelow(10**15)


@dataclass
class Charges:
    """A queue with a ``charge`` task whose ``token`` and ``card.number`` are secret."""

    queue: sqlqueue.Queue
    charge: sqlqueue.Task
    seen: list[dict[str, Any]] = field(default_factory=list)


def charges(backend: Backend, *, keys: tuple[str, ...] = (KEY_A,), **options: Any) -> Charges:
    queue = backend.queue(encryption_keys=list(keys))
    seen: list[dict[str, Any]] = []
    options.setdefault("max_attempts", 1)

    @queue.task("charge", secret_fields=["token", "card.number"], **options)
    def charge(token: str, card: dict[str, Any], amount: int, fail: str = "") -> dict[str, Any]:
        seen.append({"token": token, "card": card, "amount": amount})
        if fail == "error":
            raise ValueError(f"card {card['number']} declined for token {token!r}")
        if fail == "permanent":
            raise sqlqueue.PermanentError(
                f"gateway refused {token}", details={"request": {"token": token, "card": card}}
            )
        return {"receipt": f"paid {amount} with {token}", "card": card["number"]}

    return Charges(queue=queue, charge=charge, seen=seen)


def stored_text(backend: Backend) -> str:
    """Everything the database holds of the jobs, as text: every column of every job row and
    every batch row (a batch stores its callbacks' requests until it finishes), plus the
    database file and its WAL where the database is a file, plus ``pg_dump`` of the tables
    where the server is PostgreSQL and the tool is installed."""
    parts = []
    with backend.engine.connect() as conn:
        for table in (jobs, batches):
            rows = conn.execute(sa.select(*(sa.cast(column, sa.Text) for column in table.c)))
            parts += [str(value) for row in rows for value in row]  # not repr(): it elides
    if not backend.capable("many_hosts"):  # a database file: its bytes, after a checkpoint
        with backend.engine.connect() as conn:
            conn.exec_driver_sql("PRAGMA wal_checkpoint(FULL)")
        database = Path(str(backend.engine.url.database))
        for path in (database, database.with_name(database.name + "-wal")):
            if path.exists():
                parts.append(path.read_bytes().decode("latin-1"))
    pg_dump = shutil.which("pg_dump")
    if backend.name == "postgresql" and pg_dump is not None:  # PostgreSQL's own dump tool
        url = backend.engine.url.set(drivername="postgresql")
        dumped = subprocess.run(
            [
                pg_dump,
                "--data-only",
                f"--table={jobs.name}",
                f"--table={batches.name}",
                url.render_as_string(False),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert "COPY" in dumped.stdout
        parts.append(dumped.stdout)
    return "\n".join(parts)


def cli(backend: Backend, *args: str) -> str:
    """The output of ``python -m sqlqueue ARGS`` against the backend (stdout and stderr)."""
    done = run_cli(*args, url=backend.url)
    assert done.returncode in (0, 1), done.stderr
    return done.stdout + done.stderr


def raw_payload(backend: Backend, job_id: int) -> Any:
    with backend.engine.connect() as conn:
        return conn.execute(sa.select(jobs.c.payload).where(jobs.c.id == job_id)).scalar_one()


# -- at rest -------------------------------------------------------------------------------------


def test_every_enqueue_path_stores_ciphertext_and_the_handler_gets_the_plaintext(
    backend: Backend,
) -> None:
    app = charges(backend)
    queue, charge = app.queue, app.charge
    schedule_token = canary()

    @queue.periodic(
        "* * * * *", "renew", payload={"token": schedule_token}, secret_fields=["token"]
    )
    def renew(token: str) -> str:
        app.seen.append({"token": token, "card": {}, "amount": 0})
        return token

    tokens = [canary() for _ in range(7)]
    numbers = [canary_number() for _ in range(7)]

    def payload(i: int) -> dict[str, Any]:
        return {"token": tokens[i], "card": {"number": numbers[i], "exp": "12/30"}, "amount": i}

    with backend.engine.begin() as conn:
        queue.enqueue(conn, "charge", payload(0))
        charge.enqueue(conn, **payload(1))
        charge.options(priority=5).enqueue(conn, **payload(2))
        queue.enqueue_many(conn, [sqlqueue.JobRequest(job_type="charge", payload=payload(3))])
        charge.enqueue_many(conn, [payload(4)])

    async def enqueue_async() -> None:
        url = dialect_for(backend.engine).async_url(sa.make_url(backend.url))
        engine = create_async_engine(url)
        try:
            async with engine.begin() as conn:
                await charge.enqueue_async(conn, **payload(5))
            async with AsyncSession(engine) as session:
                await queue.enqueue_many_async(
                    session, [sqlqueue.JobRequest(job_type="charge", payload=payload(6))]
                )
                await session.commit()
        finally:
            await engine.dispose()

    asyncio.run(enqueue_async())
    assert len(Scheduler(queue, queue.periodic_schedules).run_once()) == 1

    at_rest = stored_text(backend)
    for secret in [*tokens, *map(str, numbers), schedule_token]:
        assert secret not in at_rest
    assert at_rest.count(MARKER) >= 2 * 7 + 1

    drain(queue)

    assert sorted(seen["token"] for seen in app.seen) == sorted([*tokens, schedule_token])
    got = {seen["token"]: seen for seen in app.seen}
    for i in range(7):
        assert got[tokens[i]]["card"] == {"number": numbers[i], "exp": "12/30"}
        assert type(got[tokens[i]]["card"]["number"]) is int
    at_rest = stored_text(backend)  # the results quoted the secrets: stored redacted
    for secret in [*tokens, *map(str, numbers), schedule_token]:
        assert secret not in at_rest
    done = queue.jobs(job_type="charge", status="succeeded")
    assert len(done) == 7
    assert all(job.result["receipt"].endswith("with ***") for job in done)
    assert all(job.result["card"] == "***" for job in done)


def test_reads_show_stars_in_place_of_each_secret(backend: Backend) -> None:
    app = charges(backend)
    token, number = canary(), canary_number()
    with backend.engine.begin() as conn:
        job_id = app.charge.enqueue(
            conn, token=token, card={"number": number, "exp": "12/30"}, amount=5
        )
    shown = {"token": "***", "card": {"number": "***", "exp": "12/30"}, "amount": 5}
    job = app.queue.get_job(job_id)
    assert job is not None
    assert job.payload == shown
    assert [job.payload for job in app.queue.jobs()] == [shown]
    stored = raw_payload(backend, job_id)
    stored = stored if isinstance(stored, dict) else json.loads(stored)
    assert stored["token"][MARKER].startswith("v1:")
    assert stored["card"]["exp"] == "12/30"


# -- errors, logs, the CLI -------------------------------------------------------------------------


def test_an_error_quoting_the_secrets_is_stored_and_logged_scrubbed(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    app = charges(backend, max_attempts=2, backoff=[0])
    token, number = canary(), canary_number()
    other_token, other_number = canary(), canary_number()
    with backend.engine.begin() as conn:
        failing = app.charge.enqueue(
            conn, token=token, card={"number": number}, amount=1, fail="error"
        )
        refused = app.charge.enqueue(
            conn, token=other_token, card={"number": other_number}, amount=2, fail="permanent"
        )
    caplog.set_level(logging.DEBUG)

    drain(app.queue)

    assert [seen["token"] for seen in app.seen].count(token) == 2  # both attempts got it
    job = app.queue.get_job(failing)
    assert job is not None
    assert job.status == "dead"
    assert job.last_error == "ValueError: card *** declined for token '***'"
    assert [record.error for record in job.errors] == [job.last_error] * 2
    traceback = job.errors[-1].details["traceback"]  # type: ignore[index]
    assert "ValueError: card *** declined" in traceback
    assert "line" in traceback
    other = app.queue.get_job(refused)
    assert other is not None
    assert other.status == "dead"
    assert other.last_error == "PermanentError: gateway refused ***"
    assert other.errors[0].details["request"] == {  # type: ignore[index]
        "token": "***",
        "card": {"number": "***"},
    }

    secrets_ = [token, str(number), other_token, str(other_number)]
    logged = caplog.text + "".join(str(record.__dict__) for record in caplog.records)
    assert "declined for token '***'" in logged
    at_rest = stored_text(backend)
    for secret in secrets_:
        assert secret not in logged
        assert secret not in at_rest

    printed = "\n".join(
        cli(backend, *args)
        for args in (
            ["jobs", "show", str(failing)],
            ["jobs", "show", str(refused), "--json"],
            ["jobs", "list"],
            ["jobs", "list", "--json"],
            ["dead", "list"],
            ["dead", "list", "--json"],
            ["stats"],
        )
    )
    assert "declined for token '***'" in printed
    for secret in secrets_:
        assert secret not in printed


def test_a_batch_stores_its_callbacks_secrets_sealed(backend: Backend) -> None:
    """``on_complete`` and ``on_dead`` wait in the batch row until the batch ends: their secret
    fields are sealed there as in a job row, and the callback that runs gets them opened."""
    app = charges(backend)
    child, completed, if_dead, added = canary(), canary(), canary(), canary()
    numbers = [canary_number() for _ in range(4)]

    @app.queue.task("fan_out")
    def fan_out(ctx: sqlqueue.JobContext) -> None:  # a child that adds one more charge
        ctx.add_to_batch(
            [
                sqlqueue.JobRequest(
                    job_type="charge",
                    payload={"token": added, "card": {"number": numbers[3]}, "amount": 4},
                )
            ]
        )

    with backend.engine.begin() as conn:
        batch = app.queue.enqueue_batch(
            conn,
            [
                sqlqueue.JobRequest(
                    job_type="charge",
                    payload={"token": child, "card": {"number": numbers[0]}, "amount": 1},
                ),
                sqlqueue.JobRequest(job_type="fan_out"),
            ],
            on_complete=sqlqueue.JobRequest(
                job_type="charge",
                payload={"token": completed, "card": {"number": numbers[1]}, "amount": 2},
            ),
            on_dead=sqlqueue.JobRequest(
                job_type="charge",
                payload={"token": if_dead, "card": {"number": numbers[2]}, "amount": 3},
            ),
        )
    secrets_ = [child, completed, if_dead, added, *map(str, numbers)]
    with backend.engine.connect() as conn:
        stored = conn.execute(
            sa.select(sa.cast(batches.c.on_complete, sa.Text), sa.cast(batches.c.on_dead, sa.Text))
        ).one()
    assert all(MARKER in str(request) for request in stored)  # sealed, not absent
    at_rest = stored_text(backend)
    for secret in secrets_:
        assert secret not in at_rest

    drain(app.queue)

    assert [seen["token"] for seen in app.seen] == [child, added, completed]
    assert app.seen[2]["card"] == {"number": numbers[1]}
    status = app.queue.get_batch(batch.id)
    assert status is not None
    assert status.callback_job_id is not None
    callback = app.queue.get_job(status.callback_job_id)
    assert callback is not None
    assert callback.payload["token"] == "***"
    at_rest = stored_text(backend)
    for secret in secrets_:
        assert secret not in at_rest


def test_metrics_never_show_a_secret(backend: Backend) -> None:
    """A worker serving Prometheus metrics runs jobs whose errors quote their secrets: the
    scraped page has their counts, and not one secret."""
    app = charges(backend, max_attempts=2, backoff=[0])
    tokens = [canary() for _ in range(3)]
    number = canary_number()
    with backend.engine.begin() as conn:
        ids = [
            app.charge.enqueue(
                conn, token=token, card={"number": number}, amount=n, fail=("", "error")[n % 2]
            )
            for n, token in enumerate(tokens)
        ]
    worker = app.queue.worker(metrics_port=0, poll_interval=0.05)
    with WorkerThread(worker):
        wait_until(
            lambda: all(
                (job := app.queue.get_job(job_id)) is not None
                and job.status in ("succeeded", "dead")
                for job_id in ids
            ),
            timeout=60,
            what="every charge to end",
        )
        assert worker.metrics_port is not None
        page = ""

        def scraped_all() -> bool:
            nonlocal page
            url = f"http://127.0.0.1:{worker.metrics_port}/metrics"
            with urllib.request.urlopen(url, timeout=5) as answer:
                page = answer.read().decode()
            return 'sqlqueue_jobs_total{job_type="charge",outcome="dead",queue="default"} 1.0' in (
                page
            )

        wait_until(scraped_all, timeout=30, what="the dead charge in the metrics")
    assert 'outcome="succeeded",queue="default"} 2.0' in page
    for secret in [*tokens, str(number)]:
        assert secret not in page


# -- keys ------------------------------------------------------------------------------------------


def test_keys_rotate_old_rows_stay_readable_and_a_job_no_key_opens_goes_dead(
    backend: Backend,
) -> None:
    old = charges(backend, keys=(KEY_A,), max_attempts=5)
    old_token, lost_token, new_token = canary(), canary(), canary()
    with backend.engine.begin() as conn:
        before = old.charge.enqueue(conn, token=old_token, card={"number": 1}, amount=1)

    rotated = charges(backend, keys=(KEY_B, KEY_A), max_attempts=5)  # the new key first
    with backend.engine.begin() as conn:
        after = rotated.charge.enqueue(conn, token=new_token, card={"number": 2}, amount=2)
    sealed = raw_payload(backend, after)
    sealed = sealed if isinstance(sealed, dict) else json.loads(sealed)
    token_text = sealed["token"][MARKER].removeprefix("v1:").encode()
    assert Fernet(KEY_B).decrypt(token_text) == f'"{new_token}"'.encode()
    with pytest.raises(InvalidToken):
        Fernet(KEY_A).decrypt(token_text)

    drain(rotated.queue)
    assert sorted(seen["token"] for seen in rotated.seen) == sorted([old_token, new_token])

    # KEY_A retired: a job still sealed with it goes dead, once, saying why.
    with backend.engine.begin() as conn:
        lost = old.charge.enqueue(conn, token=lost_token, card={"number": 3}, amount=3)
    retired = charges(backend, keys=(KEY_B,), max_attempts=5)
    drain(retired.queue)
    assert retired.seen == []
    job = retired.queue.get_job(lost)
    assert job is not None
    assert job.status == "dead"
    assert job.attempts == 1  # of 5: no retry can help
    assert job.last_error is not None
    assert job.last_error.startswith("SecretKeyMissing: no encryption key of this worker")
    assert "secret field" in job.last_error
    assert "rotated out" in job.last_error
    assert "traceback" not in (job.errors[0].details or {})
    assert issubclass(SecretKeyMissing, sqlqueue.PermanentError)

    # Requeued where the key is back: the new job carries the same ciphertext and runs.
    new_id = rotated.queue.requeue(lost, by="ops", reason="key restored")
    assert raw_payload(backend, new_id) == raw_payload(backend, lost)
    assert lost_token not in stored_text(backend)
    drain(rotated.queue)
    assert rotated.queue.get_job(new_id).status == "succeeded"  # type: ignore[union-attr]
    assert rotated.seen[-1]["token"] == lost_token
    assert before in {job.id for job in rotated.queue.jobs(status="succeeded")}


def test_keys_come_from_the_environment_and_are_checked_without_being_echoed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'keys.db'}"
    monkeypatch.setenv("SQLQUEUE_ENCRYPTION_KEYS", f" {KEY_B} , {KEY_A} ")
    from_env = sqlqueue.Queue(url)
    assert from_env.keyring is not None
    assert from_env.keyring.size == 2
    assert sqlqueue.Queue(url, encryption_keys=[]).keyring is None  # given: the env is not read
    assert from_env.rebind(url).keyring is from_env.keyring

    monkeypatch.setenv("SQLQUEUE_ENCRYPTION_KEYS", f"{KEY_A},not-a-key-{KEY_B[:8]}")
    with pytest.raises(sqlqueue.ConfigurationError, match="key #2 is not a Fernet key") as error:
        sqlqueue.Queue(url)
    assert KEY_B[:8] not in str(error.value)
    assert KEY_A not in str(error.value)
    with pytest.raises(sqlqueue.ConfigurationError, match="list of Fernet keys"):
        sqlqueue.Queue(url, encryption_keys=KEY_A)

    monkeypatch.delenv("SQLQUEUE_ENCRYPTION_KEYS")
    keyless = sqlqueue.Queue(url)
    with pytest.raises(sqlqueue.ConfigurationError, match=r"no encryption keys.*SQLQUEUE_ENC"):
        keyless.task("charge", secret_fields=["token"])(lambda token: None)
    assert "charge" not in keyless.tasks
    keyed = sqlqueue.Queue(url, encryption_keys=[KEY_A])
    for bad in ("token", ["card..number"], [""], [3]):
        with pytest.raises(sqlqueue.ConfigurationError, match="secret_fields"):
            keyed.task("charge", secret_fields=bad)(lambda token: None)  # type: ignore[arg-type]


# -- payload shapes --------------------------------------------------------------------------------


def test_nested_absent_and_non_string_secrets(backend: Backend) -> None:
    queue = backend.queue(encryption_keys=[KEY_A])
    seen: list[dict[str, Any]] = []

    @queue.task("sync", secret_fields=["token", "card.number", "deep.a.b", "config"])
    def sync(**payload: Any) -> None:
        seen.append(payload)

    payloads: list[dict[str, Any]] = [
        {"user": 1},  # no secret field at all
        {"card": "not-a-mapping", "deep": {"a": "no-b-here"}},  # the paths cannot exist
        {"token": None, "card": {"number": 4242, "cvc": 123}, "deep": {"a": {"b": [1, "x"]}}},
        {"token": True, "config": {"password": "hunter2", "port": 5432}, "deep": {"a": {}}},
        {"token": 1.5, "config": ["a", "list"]},
    ]
    with backend.engine.begin() as conn:
        ids = sync.enqueue_many(conn, payloads)
    assert queue.get_job(ids[0]).payload == {"user": 1}  # type: ignore[union-attr]
    assert queue.get_job(ids[1]).payload == payloads[1]  # type: ignore[union-attr]
    assert queue.get_job(ids[2]).payload == {  # type: ignore[union-attr]
        "token": "***",
        "card": {"number": "***", "cvc": 123},
        "deep": {"a": {"b": "***"}},
    }
    assert queue.get_job(ids[3]).payload == {  # type: ignore[union-attr]
        "token": "***",
        "config": "***",
        "deep": {"a": {}},
    }
    assert "hunter2" not in stored_text(backend)

    drain(queue)

    canonical = partial(json.dumps, sort_keys=True)
    assert sorted(map(canonical, seen)) == sorted(map(canonical, payloads))
    assert {type(p.get("token")) for p in seen} == {type(None), bool, float}


def test_a_secret_that_is_not_json_is_refused_and_the_encrypted_size_counts(
    backend: Backend,
) -> None:
    queue = backend.queue(encryption_keys=[KEY_A], max_payload_bytes=120)

    @queue.task("secret", secret_fields=["token"])
    def secret(token: Any) -> None:
        return None

    @queue.task("plain")
    def plain(token: Any) -> None:
        return None

    with backend.engine.begin() as conn:
        plain.enqueue(conn, token="x" * 80)  # 92 bytes in the clear: fits
        with pytest.raises(sqlqueue.PayloadError, match="over the 120-byte cap"):
            secret.enqueue(conn, token="x" * 80)  # encrypted: well over
        with pytest.raises(sqlqueue.PayloadError, match="secret field 'token'"):
            secret.enqueue(conn, token=datetime.now(UTC))
    assert len(queue.jobs()) == 1


@pytest.mark.parametrize("route", ["direct", "timeout", "async", "context", "set_result"])
def test_every_route_opens_the_secrets_and_redacts_the_result(backend: Backend, route: str) -> None:
    queue = backend.queue(encryption_keys=[KEY_A])
    seen: list[str] = []
    options: dict[str, Any] = {"secret_fields": ["token"]}
    if route == "timeout":
        options["timeout"] = 30

    if route == "async":

        @queue.task("echo", **options)
        async def echo_async(token: str) -> str:
            seen.append(token)
            return f"echo {token}"

    elif route == "context":

        @queue.task("echo", **options)
        def echo_context(token: str, ctx: sqlqueue.JobContext) -> str:
            seen.append(token)
            return f"echo {token}"

    elif route == "set_result":

        @queue.task("echo", **options)
        def echo_set_result(token: str, ctx: sqlqueue.JobContext) -> None:
            seen.append(token)
            ctx.set_result(f"echo {token}")

    else:

        @queue.task("echo", **options)
        def echo(token: str) -> str:
            seen.append(token)
            return f"echo {token}"

    task = queue.tasks["echo"]
    assert "secrets" in task.plan.steps
    assert task.plan.direct is (route == "direct")
    token = canary()
    with backend.engine.begin() as conn:
        job_id = task.enqueue(conn, token=token)
    drain(queue)
    assert seen == [token]
    assert queue.get_job(job_id).result == "echo ***"  # type: ignore[union-attr]


def test_a_plain_task_plans_no_secrets_step(backend: Backend) -> None:
    queue = backend.queue(encryption_keys=[KEY_A])

    @queue.task("plain")
    def plain(n: int) -> int:
        return n

    assert plain.secrets is None
    assert "secrets" not in plain.plan.steps
    assert plain.plan.direct


@pytest.mark.parametrize("fields", [["card", "card.number"], ["card.number", "card"]])
def test_a_field_sealed_inside_another_opens_whichever_order_they_are_declared_in(
    fields: list[str],
) -> None:
    keyring = keyring_from([KEY_A])
    sealer = secret_fields_for("charge", fields, keyring)
    assert sealer is not None
    number = canary_number()
    payload: dict[str, Any] = {"card": {"number": number, "exp": "12/30"}, "amount": 1}
    sealed = sealer.seal(payload)
    assert sealed is not None
    assert str(number) not in json.dumps(sealed)
    assert payload["card"]["number"] == number  # the caller's payload is left as it was
    opened, redactor = sealer.open(dict(sealed))
    assert opened == payload
    assert redactor.text(f"card {number} declined") == "card *** declined"
    assert sealer.redactor(sealed).text(f"{number}") == "***"
