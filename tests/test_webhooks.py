"""Webhooks as a job kind, against a real HTTP server on 127.0.0.1 and on both backends.

Signatures are checked by an independent oracle, the ``standardwebhooks`` package; every
status the issue names is answered by the server and its action checked on the job row; the
SSRF guard is tried with addresses and with names, and the server must see no connection; one
endpoint that hangs must not delay another.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import re
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from functools import partial
from typing import Any

import pytest
import sqlalchemy as sa
import standardwebhooks
import trustme
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

import sqlqueue
import sqlqueue.webhooks
from sqlqueue.dialects import dialect_for
from sqlqueue.webhooks import (
    Endpoint,
    UnknownEndpoint,
    Webhooks,
    WebhookVerificationError,
    verify,
)
from sqlqueue.webhooks._guard import forbidden_because
from sqlqueue.webhooks._policy import retry_after_seconds
from tests._support import WorkerThread, count_jobs, db_now, drain, wait_until
from tests.apps.receiver import Receiver, Reply, running_receiver
from tests.conftest import Backend

pytestmark = pytest.mark.timeout(60)

#: What the receiver's answers do to a delivery, and what goes over the wire: the subject is
#: HTTP, and the outcomes reach the database through the worker's writes that the conformance
#: suite runs on every backend. Endpoints, rotations, breakers and dedup stay on every backend.
WEBHOOK_HTTP = pytest.mark.backend_independent("webhook HTTP")

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
OTHER_SECRET = "whsec_" + "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo0MjQy"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with running_receiver() as server:
        yield server


def hooks_for(backend: Backend, **options: Any) -> tuple[sqlqueue.Queue, Webhooks]:
    """A queue with a Webhooks kind tuned for tests: local server, short timeout, no waiting."""
    queue = backend.queue()
    options.setdefault("allow_private_addresses", True)
    options.setdefault("timeout", 0.5)
    options.setdefault("max_attempts", 2)
    options.setdefault("backoff", sqlqueue.schedule([0.0]))
    return queue, Webhooks(queue, **options)


def add(backend: Backend, hooks: Webhooks, name: str, url: str, **options: Any) -> Endpoint:
    with backend.engine.begin() as conn:
        return hooks.add_endpoint(conn, name=name, url=url, **options)


def deliver(backend: Backend, hooks: Webhooks, endpoint: str, **options: Any) -> int:
    options.setdefault("event_type", "user.created")
    options.setdefault("data", {"user_id": 1})
    with backend.engine.begin() as conn:
        return hooks.deliver(conn, endpoint=endpoint, **options)


def detail(error: sqlqueue.ErrorRecord, name: str) -> Any:
    """One fact the attempt recorded in the error history (status, duration, body …)."""
    assert error.details is not None
    return error.details[name]


def last_error(found: sqlqueue.Job) -> str:
    assert found.last_error is not None
    return found.last_error


def job(queue: sqlqueue.Queue, job_id: int) -> sqlqueue.Job:
    found = queue.get_job(job_id)
    assert found is not None
    return found


# -- the public face --------------------------------------------------------------------------


def test_the_subpackage_exports_exactly_its_public_names():
    assert set(sqlqueue.webhooks.__all__) == {
        "TASK_NAME",
        "DeliveryFailed",
        "DeliveryRefused",
        "DeliveryRejected",
        "Endpoint",
        "UnknownEndpoint",
        "WebhookError",
        "WebhookVerificationError",
        "Webhooks",
        "generate_secret",
        "verify",
    }
    for name in sqlqueue.webhooks.__all__:
        value = getattr(sqlqueue.webhooks, name)
        if isinstance(value, type) and issubclass(value, Exception):
            assert issubclass(value, sqlqueue.webhooks.WebhookError), name
            assert issubclass(value, sqlqueue.SqlqueueError), name
    assert issubclass(sqlqueue.webhooks.DeliveryFailed, sqlqueue.Retry)
    assert issubclass(sqlqueue.webhooks.DeliveryRejected, sqlqueue.PermanentError)
    assert issubclass(sqlqueue.webhooks.DeliveryRefused, sqlqueue.PermanentError)


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"timeout": 0}, "timeout"),
        ({"timeout": float("nan")}, "timeout"),
        ({"retry_after_cap": -1}, "retry_after_cap"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"allow_private_addresses": "yes"}, "allow_private_addresses"),
        ({"rate_limit": sqlqueue.RateLimit(per_second=1, key="shared")}, "rate_limit"),
        ({"circuit_breaker": sqlqueue.CircuitBreaker(key="shared")}, "circuit_breaker"),
        ({"max_in_flight_per_endpoint": 0}, "max_in_flight_per_endpoint"),
        ({"max_in_flight_per_endpoint": 1.5}, "max_in_flight_per_endpoint"),
        ({"max_in_flight_per_endpoint": True}, "max_in_flight_per_endpoint"),
        ({"max_in_flight_per_endpoint": "2"}, "max_in_flight_per_endpoint"),
    ],
)
def test_bad_settings_are_refused_at_construction_naming_the_field(options, field, tmp_path):
    queue = sqlqueue.Queue(f"sqlite:///{tmp_path / 'unopened.db'}")
    with pytest.raises(sqlqueue.ConfigurationError, match=field):
        Webhooks(queue, **options)


def test_the_kind_is_an_ordinary_task_gated_per_endpoint(tmp_path):
    queue = sqlqueue.Queue(f"sqlite:///{tmp_path / 'unopened.db'}")
    hooks = Webhooks(queue, queue="partners")
    task = queue.tasks[sqlqueue.webhooks.TASK_NAME]
    assert task is hooks.task
    assert (task.queue, task.max_attempts, task.is_async) == ("partners", 12, True)
    assert task.rate_limit is not None
    assert task.circuit_breaker is not None
    for gate in (task.rate_limit, task.circuit_breaker):
        assert callable(gate.key)
        assert gate.key({"endpoint": "crm"}) == "webhook:crm"
    assert hooks.max_in_flight_per_endpoint == 2
    unguarded = Webhooks(
        sqlqueue.Queue(f"sqlite:///{tmp_path / 'other.db'}"),
        rate_limit=None,
        circuit_breaker=None,
        max_in_flight_per_endpoint=None,
    )
    assert unguarded.task.rate_limit is None
    assert unguarded.task.circuit_breaker is None
    assert unguarded.max_in_flight_per_endpoint is None
    assert unguarded.in_flight("crm") == 0


# -- verify(): the receiver's side, against the oracle ----------------------------------------


def _signed_by_oracle(
    secret: str, body: str, at: datetime, message_id: str = "msg_1"
) -> dict[str, str]:
    signature = standardwebhooks.Webhook(secret).sign(message_id, at, body)
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": signature,
    }


def test_verify_accepts_what_the_oracle_signs_and_returns_the_payload():
    body = '{"type":"user.created","data":{"user_id":1}}'
    headers = _signed_by_oracle(SECRET, body, datetime.now(UTC))
    assert verify(SECRET, headers, body.encode()) == json.loads(body)
    upper = {name.upper(): value for name, value in headers.items()}  # names without case
    assert verify(SECRET, upper, body)["data"] == {"user_id": 1}


def test_verify_refuses_stale_and_future_timestamps_with_the_tolerance():
    body = "{}"
    now = time.time()
    for offset, word in ((-301, "too old"), (301, "too new")):
        at = datetime.fromtimestamp(now + offset, UTC)
        with pytest.raises(WebhookVerificationError, match=word):
            verify(SECRET, _signed_by_oracle(SECRET, body, at), body, now=now)
    at = datetime.fromtimestamp(now - 250, UTC)
    assert verify(SECRET, _signed_by_oracle(SECRET, body, at), body, now=now) == {}
    with pytest.raises(WebhookVerificationError, match="too old"):
        verify(SECRET, _signed_by_oracle(SECRET, body, at), body, tolerance=60, now=now)


def test_verify_refuses_a_wrong_secret_an_altered_body_and_missing_headers():
    body = '{"a":1}'
    headers = _signed_by_oracle(SECRET, body, datetime.now(UTC))
    with pytest.raises(WebhookVerificationError, match="no matching signature"):
        verify(OTHER_SECRET, headers, body)
    with pytest.raises(WebhookVerificationError, match="no matching signature"):
        verify(SECRET, headers, '{"a":2}')
    with pytest.raises(WebhookVerificationError, match="no matching signature"):
        verify(SECRET, {**headers, "webhook-id": "msg_2"}, body)
    with pytest.raises(WebhookVerificationError, match="no matching signature"):
        verify(SECRET, {**headers, "webhook-signature": "v1,not-base64!! v2,xyz"}, body)
    with pytest.raises(WebhookVerificationError, match="not an integer"):
        verify(SECRET, {**headers, "webhook-timestamp": "yesterday"}, body)
    with pytest.raises(sqlqueue.ConfigurationError, match="tolerance"):
        verify(SECRET, headers, body, tolerance=-1)
    for missing in headers:
        partial = {name: value for name, value in headers.items() if name != missing}
        with pytest.raises(WebhookVerificationError, match="missing header"):
            verify(SECRET, partial, body)


def test_verify_accepts_any_current_secret_during_a_rotation():
    body = "{}"
    now = datetime.now(UTC)
    old = _signed_by_oracle(SECRET, body, now)
    new = _signed_by_oracle(OTHER_SECRET, body, now)
    both = {**new, "webhook-signature": f"{new['webhook-signature']} {old['webhook-signature']}"}
    for secrets in ([SECRET, OTHER_SECRET], [OTHER_SECRET, SECRET]):
        assert verify(secrets, old, body) == {}
        assert verify(secrets, new, body) == {}
    assert verify(SECRET, both, body) == {}
    assert verify(OTHER_SECRET, both, body) == {}


# -- what counts as a public address, and Retry-After -----------------------------------------


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("127.0.0.1", "loopback"),
        ("127.8.9.10", "loopback"),
        ("::1", "loopback"),
        ("::ffff:127.0.0.1", "loopback"),
        ("64:ff9b::7f00:1", "loopback"),
        ("10.0.0.1", "private"),
        ("172.16.5.4", "private"),
        ("192.168.1.1", "private"),
        ("fc00::1", "private"),
        ("::ffff:192.168.1.1", "private"),
        ("169.254.169.254", "cloud metadata"),
        ("fd00:ec2::254", "cloud metadata"),
        ("::ffff:169.254.169.254", "cloud metadata"),
        ("169.254.1.1", "link-local"),
        ("fe80::1", "link-local"),
        ("224.0.0.1", "multicast"),
        ("ff02::1", "multicast"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("100.64.0.1", "not a public"),
        ("168.63.129.16", "cloud metadata"),
        ("::ffff:168.63.129.16", "cloud metadata"),
        ("fec0::1", "site-local"),
        ("192.88.99.1", "6to4 relay"),
        ("192.88.98.1", None),
        ("8.8.8.8", None),
        ("2606:4700:4700::1111", None),
        ("::ffff:8.8.8.8", None),
    ],
)
def test_the_guard_names_why_an_address_is_forbidden(address, reason):
    verdict = forbidden_because(ipaddress.ip_address(address))
    if reason is None:
        assert verdict is None
    else:
        assert verdict is not None
        assert reason in verdict


def test_retry_after_is_read_as_seconds_or_an_http_date_and_capped():
    now = datetime(2030, 1, 1, tzinfo=UTC)
    date = format_datetime(now + timedelta(seconds=90), usegmt=True)
    assert retry_after_seconds("120", now=now, cap=3600) == 120
    assert retry_after_seconds(date, now=now, cap=3600) == 90
    assert retry_after_seconds("99999", now=now, cap=3600) == 3600
    assert retry_after_seconds(format_datetime(now - timedelta(hours=1)), now=now, cap=60) == 0
    assert retry_after_seconds("soon", now=now, cap=3600) is None
    assert retry_after_seconds(None, now=now, cap=3600) is None


# -- endpoints and bad input ------------------------------------------------------------------


def test_bad_input_is_refused_before_any_row_is_written(backend, receiver):
    _queue, hooks = hooks_for(backend)
    add(backend, hooks, "crm", receiver.url("/crm"), secret=SECRET)
    bad_urls = [
        "not a url",
        "ftp://crm.example.com/",
        "http:///hooks",
        "https://user:password@crm.example.com/",
        "https://crm.example.com/#fragment",
        "http://exa mple.com/",
        "",
    ]
    with backend.engine.begin() as conn:
        for url in bad_urls:
            with pytest.raises(sqlqueue.ConfigurationError, match="url"):
                hooks.add_endpoint(conn, name="bad", url=url)
        for secret in ("plain", "whsec_%%%", "whsec_c2hvcnQ="):
            with pytest.raises(sqlqueue.ConfigurationError, match="secret"):
                hooks.add_endpoint(conn, name="bad", url=receiver.url("/"), secret=secret)
        with pytest.raises(sqlqueue.ConfigurationError, match="already exists"):
            hooks.add_endpoint(conn, name="crm", url=receiver.url("/"))
        with pytest.raises(sqlqueue.ConfigurationError, match="retry_statuses"):
            hooks.add_endpoint(conn, name="bad", url=receiver.url("/"), retry_statuses=[503])
        with pytest.raises(UnknownEndpoint, match="'nope'"):
            hooks.deliver(conn, endpoint="nope", event_type="x", data={})
        for data in ({"when": datetime.now(UTC)}, {"x": float("nan")}, {1j: 2}):
            with pytest.raises(sqlqueue.PayloadError, match="JSON"):
                hooks.deliver(conn, endpoint="crm", event_type="x", data=data)
        with pytest.raises(sqlqueue.PayloadError, match="event_type"):
            hooks.deliver(conn, endpoint="crm", event_type="", data={})
        # The caller's transaction is still usable: nothing went wrong in the database.
        assert [endpoint.name for endpoint in hooks.endpoints(conn)] == ["crm"]
    for operation in (hooks.disable, hooks.enable, hooks.rotate_secret, hooks.get_endpoint):
        with backend.engine.begin() as conn, pytest.raises(UnknownEndpoint):
            operation(conn, "nope")
    assert count_jobs(backend.engine) == 0
    assert receiver.connections == 0


def test_an_endpoint_is_a_row_with_a_generated_secret(backend, receiver):
    _queue, hooks = hooks_for(backend)
    before = db_now(backend.engine)
    endpoint = add(backend, hooks, "crm", receiver.url("/crm"), retry_statuses=[409, 404, 409])
    assert endpoint.secret.startswith("whsec_")
    assert len(endpoint.secrets) == 1
    standardwebhooks.Webhook(endpoint.secret)  # the oracle takes it as a secret
    assert endpoint.retry_statuses == (404, 409)
    assert endpoint.enabled
    assert endpoint.disabled_reason is None
    assert endpoint.created_at == endpoint.updated_at >= before - timedelta(seconds=1)
    with backend.engine.begin() as conn:
        disabled = hooks.disable(conn, "crm", "partner asked for a pause")
        assert (disabled.enabled, disabled.disabled_reason) == (False, "partner asked for a pause")
        enabled = hooks.enable(conn, "crm")
        assert (enabled.enabled, enabled.disabled_reason) == (True, None)
        assert hooks.get_endpoint(conn, "crm").url == receiver.url("/crm")


# -- deliveries: signatures, the status table, idempotency ------------------------------------


@WEBHOOK_HTTP
def test_a_delivery_is_signed_so_the_oracle_verifies_it(backend, receiver):
    queue, hooks = hooks_for(backend)
    add(backend, hooks, "crm", receiver.url("/crm"), secret=SECRET)
    receiver.script("/crm", Reply(status=200, body=b'{"received": true}'))
    job_id = deliver(backend, hooks, "crm", data={"user_id": 7, "name": "Zoë"})
    drain(queue)

    (request,) = receiver.received("/crm")
    payload = standardwebhooks.Webhook(SECRET).verify(request.body, request.headers)
    assert payload["type"] == "user.created"
    assert payload["data"] == {"user_id": 7, "name": "Zoë"}
    assert datetime.fromisoformat(payload["timestamp"]).tzinfo is not None
    assert verify(SECRET, request.headers, request.body) == payload
    assert request.headers["content-type"] == "application/json"
    assert request.headers["host"] == f"127.0.0.1:{receiver.port}"
    assert request.headers["webhook-id"].startswith("msg_")

    done = job(queue, job_id)
    assert done.status == "succeeded"
    assert done.attempts == 1
    assert done.result["status"] == 200
    assert done.result["body"] == '{"received": true}'
    assert done.result["message_id"] == request.headers["webhook-id"]
    assert done.payload["endpoint"] == "crm"
    assert done.payload["event_type"] == "user.created"


@WEBHOOK_HTTP
def test_every_attempt_sends_the_same_id_and_body_with_a_fresh_signature(backend, receiver):
    queue, hooks = hooks_for(backend, max_attempts=3)
    add(backend, hooks, "crm", receiver.url("/crm"), secret=SECRET)
    receiver.script("/crm", Reply(status=500), Reply(status=502), Reply(status=204, body=b""))
    job_id = deliver(backend, hooks, "crm")
    drain(queue)

    requests = receiver.received("/crm")
    assert len(requests) == 3
    assert len({request.headers["webhook-id"] for request in requests}) == 1
    assert len({request.body for request in requests}) == 1
    for request in requests:
        standardwebhooks.Webhook(SECRET).verify(request.body, request.headers)
    done = job(queue, job_id)
    assert (done.status, done.attempts) == ("succeeded", 3)
    assert [detail(error, "status") for error in done.errors] == [500, 502]


def test_the_same_idempotency_key_delivers_once(backend, receiver):
    queue, hooks = hooks_for(backend)
    add(backend, hooks, "crm", receiver.url("/crm"))
    receiver.script("/crm", Reply(status=200))
    first = deliver(backend, hooks, "crm", idempotency_key="crm:user:1:created")
    second = deliver(backend, hooks, "crm", idempotency_key="crm:user:1:created")
    assert first == second
    drain(queue)
    third = deliver(backend, hooks, "crm", idempotency_key="crm:user:1:created")
    drain(queue)
    assert third == first
    assert len(receiver.received("/crm")) == 1
    assert count_jobs(backend.engine) == 1


def test_an_async_app_delivers_through_its_async_connection_or_session(backend, receiver):
    queue, hooks = hooks_for(backend)
    add(backend, hooks, "crm", receiver.url("/crm"))
    receiver.script("/crm", Reply(status=200))

    async def scenario() -> list[int]:
        url = dialect_for(backend.engine).async_url(sa.make_url(backend.url))
        engine = create_async_engine(url.render_as_string(hide_password=False))
        try:
            async with engine.connect() as conn:  # rolled back: nothing is delivered
                await conn.begin()
                await hooks.deliver_async(conn, endpoint="crm", event_type="a", data={})
                await conn.rollback()
            async with engine.begin() as conn:
                first = await hooks.deliver_async(conn, endpoint="crm", event_type="b", data={})
            async with AsyncSession(engine) as session:
                second = await hooks.deliver_async(session, endpoint="crm", event_type="c", data={})
                await session.commit()
            return [first, second]
        finally:
            await engine.dispose()

    ids = asyncio.run(scenario())
    drain(queue)
    assert [job(queue, job_id).status for job_id in ids] == ["succeeded", "succeeded"]
    assert sorted(json.loads(r.body)["type"] for r in receiver.received("/crm")) == ["b", "c"]


#: (path, replies, endpoint options) → the job's status, attempts, and each attempt's HTTP status.
STATUS_CASES: list[tuple[str, list[Reply], dict[str, Any], str, int, list[int | None]]] = [
    ("/ok", [Reply(status=200)], {}, "succeeded", 1, []),
    ("/accepted", [Reply(status=202, body=b"")], {}, "succeeded", 1, []),
    ("/500", [Reply(status=500, body=b"boom")], {}, "dead", 2, [500, 500]),
    ("/500-then-ok", [Reply(status=500), Reply(status=200)], {}, "succeeded", 2, [500]),
    ("/408-then-ok", [Reply(status=408), Reply(status=200)], {}, "succeeded", 2, [408]),
    ("/429", [Reply(status=429)], {}, "dead", 2, [429, 429]),
    ("/503-long-body", [Reply(status=503, body=b"x" * 5000)], {}, "dead", 2, [503, 503]),
    ("/400", [Reply(status=400, body=b"missing field email")], {}, "dead", 1, [400]),
    ("/404", [Reply(status=404)], {}, "dead", 1, [404]),
    ("/404-retried", [Reply(status=404)], {"retry_statuses": [404]}, "dead", 2, [404, 404]),
    ("/410", [Reply(status=410, body=b"unsubscribed")], {}, "dead", 1, [410]),
    (
        "/redirect",
        [Reply(status=302, headers={"location": "/elsewhere"})],
        {},
        "dead",
        1,
        [302],
    ),
    ("/slow", [Reply(status=200, hold=True)], {}, "dead", 2, [None, None]),
    ("/reset", [Reply(reset=True)], {}, "dead", 2, [None, None]),
    ("/reset-then-ok", [Reply(reset=True), Reply(status=200)], {}, "succeeded", 2, [None]),
]


#: The attempts' timeout in the table above: long enough that a loaded machine never turns a
#: quick answer into a timeout (0.5 s did, once: a first attempt at /404 counted as a retry).
#: "/slow" answers only once the test is over, so its attempts always time out.
STATUS_TIMEOUT = 2.0


@WEBHOOK_HTTP
def test_each_answer_leads_to_its_action(backend, receiver):
    queue, hooks = hooks_for(backend, timeout=STATUS_TIMEOUT)
    ids = {}
    for path, replies, options, *_ in STATUS_CASES:
        receiver.script(path, *replies)
        add(backend, hooks, path.strip("/"), receiver.url(path), **options)
        ids[path] = deliver(backend, hooks, path.strip("/"))
    drain(queue)

    for path, _, _, status, attempts, statuses in STATUS_CASES:
        done = job(queue, ids[path])
        seen = (done.status, done.attempts, [detail(e, "status") for e in done.errors])
        assert seen == (status, attempts, statuses), path
        assert len(receiver.received(path)) == attempts, path
        for error in done.errors:
            details = error.details
            assert details is not None, path
            assert details["host"] == "127.0.0.1", path
            assert isinstance(details["duration_seconds"], float), path
            assert isinstance(details["body"], str), path
    host = "127.0.0.1"
    by_path = {path: job(queue, job_id) for path, job_id in ids.items()}
    assert by_path["/500"].last_error is not None
    assert by_path["/500"].last_error.startswith(
        f"DeliveryFailed: 500 Internal Server Error from {host} after 0."
    )
    assert detail(by_path["/500"].errors[0], "body") == "boom"
    assert detail(by_path["/503-long-body"].errors[0], "body") == "x" * 1024  # the first KiB
    assert last_error(by_path["/400"]).startswith(
        f"DeliveryRejected: 400 Bad Request from {host} after "
    )
    assert by_path["/400"].errors[0].kind == "DeliveryRejected"
    assert detail(by_path["/400"].errors[0], "body") == "missing field email"
    assert "redirect to /elsewhere, not followed" in last_error(by_path["/redirect"])
    assert receiver.received("/elsewhere") == []
    slow = by_path["/slow"].errors[0]
    assert slow.kind == "DeliveryFailed"
    # the time it says is measured (2 s and a loaded machine's lag), the timeout is the setting
    assert re.search(r"no answer from 127\.0\.0\.1 after \d+\.\d s", slow.error), slow.error
    assert "(the 2 s timeout passed)" in slow.error
    assert detail(slow, "duration_seconds") >= 1.9, "it gave up no earlier than its timeout"
    assert detail(by_path["/reset"].errors[0], "error")
    # 410 Gone disabled its endpoint, saying why.
    with backend.engine.connect() as conn:
        gone = hooks.get_endpoint(conn, "410")
        assert not gone.enabled
        assert gone.disabled_reason is not None
        assert "410 Gone" in gone.disabled_reason
        assert all(hooks.get_endpoint(conn, p.strip("/")).enabled for p in ids if p != "/410")


@WEBHOOK_HTTP
def test_retry_after_is_honoured_in_seconds_and_as_a_date_and_capped(backend, receiver):
    queue, hooks = hooks_for(backend, retry_after_cap=600)
    asked_for = (db_now(backend.engine) + timedelta(seconds=90)).replace(microsecond=0)
    date = format_datetime(asked_for, usegmt=True)
    cases = {
        "/seconds": (Reply(status=503, headers={"retry-after": "120"}), 120),
        "/date": (Reply(status=503, headers={"retry-after": date}), 90),
        "/capped": (Reply(status=429, headers={"retry-after": "86400"}), 600),
        "/garbage": (Reply(status=503, headers={"retry-after": "later"}), 0),  # the backoff
    }
    ids = {}
    for path, (reply, _) in cases.items():
        receiver.script(path, reply)
        add(backend, hooks, path.strip("/"), receiver.url(path))
        ids[path] = deliver(backend, hooks, path.strip("/"))
    drain(queue)
    for path, (_, delay) in cases.items():
        done = job(queue, ids[path])
        if path == "/garbage":  # retried at once by the test's zero backoff, then dead
            assert (done.status, done.attempts) == ("dead", 2)
            continue
        assert (done.status, done.attempts) == ("failed", 1), path
        # The failure and its retry time are one statement: the retry is due that long after
        # the row's updated_at (to the database's precision: SQLite keeps milliseconds).
        retry_in = (done.next_run_at - done.updated_at).total_seconds()
        if path == "/date":  # counted from the moment the attempt read the date, not exact
            assert done.next_run_at >= asked_for - timedelta(milliseconds=10), "not before it"
            assert retry_in <= delay + 0.01, (path, retry_in)  # the test asked 90 s ahead
        else:
            assert retry_in == pytest.approx(delay, abs=0.01), path
        assert detail(done.errors[0], "retry_after") is not None
        assert last_error(done).startswith("DeliveryFailed: 5") or path == "/capped"


def test_a_secret_rotation_signs_with_old_and_new_until_the_grace_ends(backend, receiver):
    queue, hooks = hooks_for(backend)
    add(backend, hooks, "crm", receiver.url("/crm"), secret=SECRET)
    receiver.script("/crm", Reply(status=200))
    with backend.engine.begin() as conn:
        rotated = hooks.rotate_secret(conn, "crm", grace=3600, secret=OTHER_SECRET)
    assert rotated.secrets == (OTHER_SECRET, SECRET)
    assert rotated.secret == OTHER_SECRET
    deliver(backend, hooks, "crm")
    drain(queue)
    (request,) = receiver.received("/crm")
    assert len(request.headers["webhook-signature"].split()) == 2
    for secret in (SECRET, OTHER_SECRET):  # a receiver holding either one accepts it
        standardwebhooks.Webhook(secret).verify(request.body, request.headers)
        verify(secret, request.headers, request.body)

    with backend.engine.begin() as conn:  # no grace: the old secrets stop signing now
        final = hooks.rotate_secret(conn, "crm", grace=0)
    assert len(final.secrets) == 1
    assert final.secret not in (SECRET, OTHER_SECRET)
    deliver(backend, hooks, "crm")
    drain(queue)
    last = receiver.received("/crm")[-1]
    assert len(last.headers["webhook-signature"].split()) == 1
    standardwebhooks.Webhook(final.secret).verify(last.body, last.headers)
    with pytest.raises(standardwebhooks.webhooks.WebhookVerificationError):
        standardwebhooks.Webhook(OTHER_SECRET).verify(last.body, last.headers)


def _in_thread(work: Callable[[], object]) -> tuple[threading.Thread, list[BaseException]]:
    """Run ``work`` in a thread of its own (a second client); its error lands in the list."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as error:
            errors.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, errors


def test_concurrent_rotations_take_turns_and_keep_both_new_secrets(backend):
    _queue, hooks = hooks_for(backend)
    add(backend, hooks, "crm", "https://crm.example.com/hooks", secret=SECRET)
    first, second = sqlqueue.webhooks.generate_secret(), sqlqueue.webhooks.generate_secret()

    def rotate_second() -> None:
        with backend.engine.begin() as conn:
            hooks.rotate_secret(conn, "crm", grace=3600, secret=second)

    with backend.engine.begin() as conn:
        hooks.rotate_secret(conn, "crm", grace=3600, secret=first)
        # A second client rotates while this transaction is still open: it must wait for it,
        # not read the secrets as they were and write its own over the first new one.
        thread, errors = _in_thread(rotate_second)
        thread.join(0.5)
        assert thread.is_alive()
    thread.join(30)
    assert not thread.is_alive()
    assert errors == []
    with backend.engine.connect() as conn:
        assert hooks.get_endpoint(conn, "crm").secrets == (second, first, SECRET)


def test_rotations_from_many_threads_at_once_lose_no_secret(backend):
    _queue, hooks = hooks_for(backend)
    add(backend, hooks, "crm", "https://crm.example.com/hooks", secret=SECRET)
    new = [sqlqueue.webhooks.generate_secret() for _ in range(6)]
    start = threading.Barrier(len(new))

    def rotate(secret: str) -> None:
        start.wait(5)
        with backend.engine.begin() as conn:
            hooks.rotate_secret(conn, "crm", grace=3600, secret=secret)

    started = [_in_thread(partial(rotate, secret)) for secret in new]
    for thread, errors in started:
        thread.join(30)
        assert not thread.is_alive()
        assert errors == []
    with backend.engine.connect() as conn:
        secrets = hooks.get_endpoint(conn, "crm").secrets
    assert sorted(secrets) == sorted([*new, SECRET])
    assert secrets[-1] == SECRET


def test_a_concurrent_add_of_a_taken_name_is_the_clear_error(backend):
    _queue, hooks = hooks_for(backend)

    def add_again() -> None:
        with backend.engine.begin() as conn:
            hooks.add_endpoint(conn, name="crm", url="https://other.example.com/hooks")

    with backend.engine.begin() as conn:
        hooks.add_endpoint(conn, name="crm", url="https://crm.example.com/hooks")
        # The second client cannot see the uncommitted row; its insert meets it anyway.
        thread, errors = _in_thread(add_again)
        thread.join(0.5)
        assert thread.is_alive()
    thread.join(30)
    assert not thread.is_alive()
    assert len(errors) == 1
    assert isinstance(errors[0], sqlqueue.ConfigurationError), repr(errors[0])
    assert str(errors[0]) == "an endpoint named 'crm' already exists"
    with backend.engine.connect() as conn:
        assert [e.url for e in hooks.endpoints(conn)] == ["https://crm.example.com/hooks"]


def test_a_delivery_to_a_disabled_endpoint_goes_dead_without_a_request(backend, receiver):
    queue, hooks = hooks_for(backend)
    add(backend, hooks, "crm", receiver.url("/crm"))
    receiver.script("/crm", Reply(status=200))
    with backend.engine.begin() as conn:
        hooks.disable(conn, "crm", "contract ended")
    job_id = deliver(backend, hooks, "crm")
    drain(queue)
    dead = job(queue, job_id)
    assert (dead.status, dead.attempts) == ("dead", 1)
    assert dead.last_error == (
        "DeliveryRefused: endpoint 'crm' is disabled: contract ended; enable it, then requeue "
        "this delivery"
    )
    assert receiver.connections == 0
    # Support enables it and requeues the dead delivery: it is sent, under the same webhook-id.
    with backend.engine.begin() as conn:
        hooks.enable(conn, "crm")
    again = queue.requeue(job_id, by="support", reason="contract renewed")
    drain(queue)
    assert job(queue, again).status == "succeeded"
    (request,) = receiver.received("/crm")
    assert request.headers["webhook-id"] == dead.payload["message_id"]


# -- the SSRF guard ---------------------------------------------------------------------------


@WEBHOOK_HTTP
def test_the_guard_refuses_private_addresses_and_names_and_nothing_is_sent(backend, receiver):
    queue, hooks = hooks_for(backend, allow_private_addresses=False)
    port = receiver.port
    targets = {
        "ipv4-loopback": (f"http://127.0.0.1:{port}/", "a loopback address"),
        "ipv6-loopback": (f"http://[::1]:{port}/", "a loopback address"),
        "mapped": (f"http://[::ffff:127.0.0.1]:{port}/", "a loopback address (127.0.0.1 inside"),
        "name": (f"http://localhost:{port}/", "localhost resolves to 127.0.0.1, which is a loop"),
        "decimal": (f"http://2130706433:{port}/", "resolves to 127.0.0.1, which is a loopback"),
        "hex": (f"http://0x7f000001:{port}/", "resolves to 127.0.0.1, which is a loopback"),
        "short": (f"http://127.1:{port}/", "resolves to 127.0.0.1, which is a loopback"),
        "metadata": ("http://169.254.169.254/latest/meta-data/", "a cloud metadata address"),
        "metadata-v6": ("http://[fd00:ec2::254]/", "a cloud metadata address"),
        "private": ("http://10.0.0.1/", "a private address"),
        "private-v6": ("http://[fd12:3456::1]/", "a private address"),
        "link-local": ("http://169.254.10.10/", "a link-local address"),
        "link-local-v6": ("http://[fe80::1]/", "a link-local address"),
        "multicast": ("http://224.0.0.251/", "a multicast address"),
        "unspecified": (f"http://0.0.0.0:{port}/", "the unspecified address"),
        "unspecified-v6": (f"http://[::]:{port}/", "the unspecified address"),
    }
    ids = {}
    for name, (url, _) in targets.items():
        add(backend, hooks, name, url)
        ids[name] = deliver(backend, hooks, name)
    drain(queue)
    for name, (_, reason) in targets.items():
        dead = job(queue, ids[name])
        assert (dead.status, dead.attempts) == ("dead", 1), name
        assert dead.last_error is not None, name
        assert dead.last_error.startswith("DeliveryRefused: refused to connect: "), name
        assert reason in dead.last_error, (name, dead.last_error)
    assert receiver.connections == 0
    assert receiver.requests == []


@WEBHOOK_HTTP
def test_a_name_reaches_its_address_with_its_host_header_when_private_is_allowed(backend, receiver):
    queue, hooks = hooks_for(backend)  # allow_private_addresses=True, as the tests need
    add(backend, hooks, "local", receiver.url("/local", host="localhost"))
    receiver.script("/local", Reply(status=200))
    job_id = deliver(backend, hooks, "local")
    drain(queue)
    assert job(queue, job_id).status == "succeeded"
    (request,) = receiver.received("/local")
    assert request.headers["host"] == f"localhost:{receiver.port}"


@WEBHOOK_HTTP
def test_https_is_verified_against_the_name_while_connecting_to_the_checked_address(backend):
    authority = trustme.CA()
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("localhost").configure_cert(server_tls)
    client_tls = ssl.create_default_context()
    authority.configure_trust(client_tls)
    queue, hooks = hooks_for(backend, ssl_context=client_tls)
    with running_receiver(tls=server_tls) as receiver:
        receiver.script("/secure", Reply(status=200))
        # The request goes to 127.0.0.1; the certificate is for "localhost": it verifies only
        # because the name is sent as the TLS server name and checked against the certificate.
        add(backend, hooks, "secure", receiver.url("/secure", host="localhost", scheme="https"))
        add(backend, hooks, "by-ip", receiver.url("/secure", scheme="https"))
        good = deliver(backend, hooks, "secure")
        mismatch = deliver(backend, hooks, "by-ip")
        drain(queue)
        assert job(queue, good).status == "succeeded"
        (request,) = receiver.received("/secure")
        assert request.headers["host"] == f"localhost:{receiver.port}"
    failed = job(queue, mismatch)
    assert (failed.status, failed.attempts) == ("dead", 2)
    assert "CERTIFICATE_VERIFY_FAILED" in detail(failed.errors[0], "error")


# -- isolation --------------------------------------------------------------------------------


def test_a_hanging_endpoint_does_not_delay_another_with_the_default_settings(
    backend, receiver, capsys
):
    # Every isolation setting is the default: rate limit (5/s, burst 10), circuit breaker (5
    # failures), max_in_flight_per_endpoint (2), and the worker's default 4 slots. The stuck
    # endpoint answers only once the test has looked, and the timeout is longer than the whole
    # test, so its attempts hang all the while, however slow the machine: without the
    # in-flight cap it takes all 4 slots (its burst lets 10 start), and the other endpoint's
    # deliveries never go out while the test looks.
    queue = backend.queue()
    hooks = Webhooks(queue, allow_private_addresses=True, timeout=300.0)
    assert hooks.max_in_flight_per_endpoint == 2
    add(backend, hooks, "stuck", receiver.url("/stuck"))
    add(backend, hooks, "fine", receiver.url("/fine"))
    receiver.script("/stuck", Reply(status=503, hold=True))  # answers once released
    receiver.script("/fine", Reply(status=200))
    stuck = [deliver(backend, hooks, "stuck", data={"n": n}) for n in range(20)]

    waits = []
    with WorkerThread(queue.worker(poll_interval=0.05)):  # concurrency=4, the default
        try:
            wait_until(lambda: len(receiver.received("/stuck")) >= 2)
            # The stuck endpoint has taken every slot it can get: its cap of two in flight.
            wait_until(lambda: hooks.in_flight("stuck") == 2, what="two stuck deliveries in flight")
            for n in range(1, 4):
                sent = time.monotonic()
                deliver(backend, hooks, "fine", data={"n": n})
                wait_until(partial(_received, receiver, "/fine", n), timeout=10)
                waits.append(time.monotonic() - sent)
            hanging, in_flight = len(receiver.received("/stuck")), hooks.in_flight("stuck")
        finally:
            receiver.release()  # the stuck requests get their 503, so the worker can stop
    with capsys.disabled():
        print(
            f"\n    [{backend.name}] deliveries beside a hanging endpoint went out "
            f"{min(waits):.2f}..{max(waits):.2f} s after their enqueue"
        )
    # Every delivery to the other endpoint went out while both stuck attempts still hung (they
    # could not end before the release); two deliveries hung; the other 18 were snoozed, each
    # freeing its slot at once.
    assert (hanging, in_flight) == (2, 2)
    # A snooze is neither an attempt nor an error: only the requests sent left a trace.
    rows = [job(queue, job_id) for job_id in stuck]
    assert sum(row.attempts for row in rows) == len(receiver.received("/stuck"))
    assert all(len(row.errors) == row.attempts for row in rows)
    assert all(row.status in ("queued", "failed") for row in rows)


@WEBHOOK_HTTP
def test_the_in_flight_cap_holds_a_slow_endpoint_to_two_and_loses_nothing(backend, receiver):
    queue, hooks = hooks_for(backend, timeout=2.0, max_in_flight_per_endpoint=2)
    add(backend, hooks, "slow", receiver.url("/slow"))
    receiver.script("/slow", Reply(status=200, delay=0.3))
    ids = [deliver(backend, hooks, "slow", data={"n": n}) for n in range(6)]
    with WorkerThread(queue.worker(concurrency=8, poll_interval=0.05)):
        wait_until(lambda: all(job(queue, job_id).status == "succeeded" for job_id in ids))
    assert receiver.peak["/slow"] == 2  # 8 free slots, yet never more than 2 at once
    assert len(receiver.received("/slow")) == 6
    for job_id in ids:
        done = job(queue, job_id)
        assert (done.attempts, len(done.errors)) == (1, 0)  # the snoozes left no trace


@WEBHOOK_HTTP
def test_without_the_cap_a_slow_endpoint_takes_every_free_slot(backend, receiver):
    queue, hooks = hooks_for(backend, timeout=2.0, max_in_flight_per_endpoint=None)
    assert hooks.max_in_flight_per_endpoint is None
    add(backend, hooks, "slow", receiver.url("/slow"))
    receiver.script("/slow", Reply(status=200, delay=0.5))
    ids = [deliver(backend, hooks, "slow", data={"n": n}) for n in range(4)]
    with WorkerThread(queue.worker(concurrency=4, poll_interval=0.05)):
        wait_until(lambda: all(job(queue, job_id).status == "succeeded" for job_id in ids))
    assert receiver.peak["/slow"] == 4


def test_a_hanging_endpoint_opens_its_breaker_and_its_deliveries_wait(backend, receiver):
    queue, hooks = hooks_for(
        backend,
        timeout=1.0,
        max_attempts=5,
        backoff=sqlqueue.schedule([0.2]),
        # A window and a cooldown far longer than the test: once open, the breaker stays
        # open until the test is over, however slow the machine.
        circuit_breaker=sqlqueue.CircuitBreaker(
            failure_threshold=2, window_seconds=3600, cooldown_seconds=3600
        ),
    )
    add(backend, hooks, "stuck", receiver.url("/stuck"))
    add(backend, hooks, "fine", receiver.url("/fine"))
    receiver.script("/stuck", Reply(status=200, hold=True))  # never answers in time
    receiver.script("/fine", Reply(status=200))
    stuck = [deliver(backend, hooks, "stuck", data={"n": n}) for n in range(8)]

    with WorkerThread(queue.worker(concurrency=4, poll_interval=0.05)):
        # The two capped attempts time out together: two failures open the breaker; the
        # stuck endpoint's jobs then wait without attempts, and the other endpoint still
        # gets its deliveries.
        wait_until(lambda: _breaker_state(backend, "webhook:stuck") == "open", timeout=10)
        deliver(backend, hooks, "fine", data={"n": 1})
        wait_until(lambda: len(receiver.received("/fine")) == 1, timeout=5)
        # The attempts that began before the breaker opened have ended (timed out).
        wait_until(lambda: hooks.in_flight("stuck") == 0, what="no stuck delivery in flight")
        attempts_while_open = len(receiver.received("/stuck"))
        # Two more deliveries to the other endpoint: the worker ran more rounds meanwhile,
        # and none of them attempted the stuck endpoint while its breaker is open.
        for n in (2, 3):
            deliver(backend, hooks, "fine", data={"n": n})
            wait_until(partial(_received, receiver, "/fine", n), timeout=10)
        assert len(receiver.received("/stuck")) == attempts_while_open
        assert _breaker_state(backend, "webhook:stuck") == "open"
    assert attempts_while_open <= 4  # the cap and the breaker held the others back
    assert all(job(queue, job_id).status in ("queued", "failed") for job_id in stuck)


def _received(receiver: Receiver, path: str, count: int) -> bool:
    return len(receiver.received(path)) == count


def _breaker_state(backend: Backend, key: str) -> str | None:
    table = sa.table("sqlqueue_circuit_breakers", sa.column("key"), sa.column("state"))
    with backend.engine.connect() as conn:
        value = conn.execute(sa.select(table.c.state).where(table.c.key == key)).scalar()
    return None if value is None else str(value)
