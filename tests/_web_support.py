"""What the web page's tests share: a queue with jobs that succeed, fail and die (one with a
secret field), a page's CSRF token, a test client that talks as the page's own browser would,
and a real uvicorn server in a thread on a free port."""

from __future__ import annotations

import random
import re
import socket
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import uvicorn
from cryptography.fernet import Fernet

with warnings.catch_warnings():  # Starlette would rather have httpx2; httpx still works
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

import sqlqueue
from tests._support import db_now, drain
from tests.conftest import Backend
from tests.test_operations import set_times

KEY = Fernet.generate_key().decode()
#: Where the test client says it is: a host the page allows by default, and the ``Origin`` a
#: browser showing the page would send with its forms.
ORIGIN = "http://localhost"
TOKEN = re.compile(r'name="csrf_token" value="([^"]+)"')


def make_queue(backend: Backend) -> sqlqueue.Queue:
    """Tasks that succeed, die at once (``crm.sync``; their error names a payload value) and
    fail now and then (``flaky``), plus one with a secret field."""
    queue = backend.queue(encryption_keys=[KEY])

    @queue.task("mail.send", queue="mail")
    def send(n: int = 0, **details: Any) -> None:  # details: ``later``, ``note`` …
        return None

    @queue.task("crm.sync", queue="hooks", max_attempts=1)
    def sync(n: int = 0, error: str = "503 from crm") -> None:
        raise ConnectionError(error)

    @queue.task("flaky", queue="hooks", max_attempts=3, backoff=[3600])
    def flaky(n: int = 0) -> None:
        raise TimeoutError("endpoint timed out")

    @queue.task("charge", queue="billing", max_attempts=1, secret_fields=["token"])
    def charge(token: str, amount: int) -> None:
        raise ValueError("card declined")

    return queue


def enqueue(queue: sqlqueue.Queue, job_type: str, count: int, **payload: Any) -> list[int]:
    requests = [
        sqlqueue.JobRequest(job_type=job_type, payload={"n": i, **payload}) for i in range(count)
    ]
    with queue.engine.begin() as conn:
        return queue.enqueue_many(conn, requests)


def populated(
    backend: Backend, *, history: bool = False
) -> tuple[sqlqueue.Queue, dict[str, list[int]]]:
    """A queue after a burst worker ran: 3 succeeded, 2 dead with a 503, 1 dead with a 410,
    1 failed waiting for a retry, 1 dead charge holding a secret, 2 queued. ``history``: and an
    hour of it for the chart, 90 successes and 12 deaths (a 504) spread over sixty minutes."""
    queue = make_queue(backend)
    ids = {
        "ok": enqueue(queue, "mail.send", 3),
        "dead_503": enqueue(queue, "crm.sync", 2),
        "dead_410": enqueue(queue, "crm.sync", 1, error="410 Gone"),
        "failed": enqueue(queue, "flaky", 1),
    }
    with queue.engine.begin() as conn:
        ids["charge"] = [queue.enqueue(conn, "charge", {"token": "tok_live_SECRET", "amount": 5})]
    if history:
        ids["history_ok"] = enqueue(queue, "mail.send", 90)
        ids["history_dead"] = enqueue(queue, "crm.sync", 12, error="504 Gateway Timeout")
    drain(queue)
    if history:
        now = db_now(backend.engine)
        spread = random.Random(15)  # the same hour on every run
        for job_id in [*ids["history_ok"], *ids["history_dead"]]:
            ago = timedelta(seconds=spread.triangular(60, 3600, 1500))
            set_times(backend.engine, [job_id], finished_at=now - ago)
    ids["queued"] = enqueue(queue, "mail.send", 2, later=True)
    return queue, ids


def token_of(html: str) -> str:
    """The CSRF token a page put in its forms."""
    found = TOKEN.search(html)
    assert found is not None, "the page has no form with a CSRF token"
    return found.group(1)


def browser_client(app: Any, **options: Any) -> TestClient:
    """``app`` in Starlette's TestClient as a browser on the page: it asks for ``localhost``
    and its POSTs carry the page's own ``Origin``."""
    options.setdefault("follow_redirects", False)
    return TestClient(app, base_url=ORIGIN, headers={"Origin": ORIGIN}, **options)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def serving(app: Any) -> Iterator[str]:
    """``app`` served by uvicorn in a thread on a free port; yields its base URL."""
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
