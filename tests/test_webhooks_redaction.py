"""What a receiver answers is kept (the body's excerpt, ``Location``, a transport error) only
scrubbed: the endpoint's signing secrets redacted, a URL's password hidden, then cut, as any
text sqlqueue stores (``sqlqueue/_scrub.py``). A receiver that echoes its secret in a debugging
answer, or a secret straddling the excerpt's 1,024-character cut, leaves no run of it in the
job's row, its result or its error history. Against a real HTTP server on 127.0.0.1.
"""

from __future__ import annotations

import base64
import json
import secrets
from collections.abc import Iterator
from urllib.parse import quote_plus

import pytest
import sqlalchemy as sa

import sqlqueue
from sqlqueue._schema import jobs
from sqlqueue.webhooks import Webhooks
from tests._support import drain
from tests.apps.receiver import Receiver, Reply, running_receiver
from tests.conftest import Backend

pytestmark = [pytest.mark.timeout(60), pytest.mark.backend_independent("webhook HTTP")]

PASSWORD = "hunter2-Pa55word"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with running_receiver() as server:
        yield server


def runs(text: str, size: int = 8) -> set[str]:
    """Every run of ``size`` characters of ``text``: none may be kept anywhere."""
    return {text[start : start + size] for start in range(len(text) - size + 1)}


def stored_text(backend: Backend) -> str:
    with backend.engine.connect() as conn:
        rows = conn.execute(sa.select(*(sa.cast(column, sa.Text) for column in jobs.c)))
        return "\n".join(str(value) for row in rows for value in row)


def test_a_receiver_echoing_the_signing_secret_leaves_no_run_of_it_stored(
    backend: Backend, receiver: Receiver
) -> None:
    queue = backend.queue()
    hooks = Webhooks(
        queue,
        allow_private_addresses=True,
        timeout=5.0,
        max_attempts=1,
        backoff=sqlqueue.schedule([0.0]),
    )
    # A key whose base64 holds "+" and "/": its URL-encoded form differs from it.
    key = b"\xfb\xef\xbe\xff\xff\xff" * 4 + secrets.token_bytes(8)
    secret = "whsec_" + base64.b64encode(key).decode()
    encoded = secret.removeprefix("whsec_")
    assert "+" in encoded
    assert "/" in encoded
    debug = (
        f"signature mismatch: expected a key of {secret} (raw {encoded}), "
        f"see https://admin:{PASSWORD}@example.com/debug?s={quote_plus(secret)}"
    )
    replies = {
        "/debug": Reply(status=500, body=debug.encode()),
        "/ok": Reply(status=200, body=json.dumps({"echo": secret}).encode()),
        # the secret straddles the excerpt's cut: its first characters would end the kept part
        "/edge": Reply(status=503, body=("x" * 1020 + secret + "y" * 200).encode()),
        "/moved": Reply(status=302, headers={"location": f"/to?key={encoded}"}),
    }
    ids = {}
    with backend.engine.begin() as conn:
        for path, reply in replies.items():
            receiver.script(path, reply)
            name = path.strip("/")
            hooks.add_endpoint(conn, name=name, url=receiver.url(path), secret=secret)
            ids[path] = hooks.deliver(conn, endpoint=name, event_type="t", data={})
    drain(queue)

    found = {path: queue.get_job(job_id) for path, job_id in ids.items()}
    assert {path: job.status for path, job in found.items() if job} == {
        "/debug": "dead",
        "/ok": "succeeded",
        "/edge": "dead",
        "/moved": "dead",
    }
    kept = {
        path: json.dumps(
            [job.result, job.last_error, [(e.error, e.details) for e in job.errors]],
            ensure_ascii=False,
        )
        for path, job in found.items()
        if job
    }
    everything = "\n".join([*kept.values(), stored_text(backend)])
    for text in (secret, encoded, PASSWORD, quote_plus(secret)):
        leaked = {run for run in runs(text) if run in everything}
        assert not leaked, (text, sorted(leaked)[:3])
    debug_job, ok_job, edge_job = found["/debug"], found["/ok"], found["/edge"]
    assert debug_job is not None
    assert ok_job is not None
    assert edge_job is not None
    assert debug_job.errors[0].details is not None
    assert debug_job.errors[0].details["body"] == (
        "signature mismatch: expected a key of *** (raw ***), "
        "see https://admin:***@example.com/debug?s=***"
    )
    assert ok_job.result["body"] == '{"echo": "***"}'
    assert edge_job.errors[0].details is not None
    # redacted first, then cut to 1,024 characters: the secret is whole when it is found
    assert edge_job.errors[0].details["body"] == "x" * 1020 + "***" + "y"
