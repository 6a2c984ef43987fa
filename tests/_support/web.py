"""What the web page's tests share: a queue with jobs that succeed, fail and die (one with a
secret field), a page's CSRF token, a test client that talks as the page's own browser would,
and a real uvicorn server in a thread, on a listening socket
bound to port 0 that it is handed (no free-port race)."""

from __future__ import annotations

import random
import re
import subprocess
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import uvicorn
from cryptography.fernet import Fernet

with warnings.catch_warnings():  # Starlette would rather have httpx2; httpx still works
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

import sqlqueue
from sqlqueue.testing import age_jobs
from tests._support.cli import sqlqueue_command
from tests._support.jobs import drain, enqueue
from tests._support.ports import listening_socket, port_in
from tests._support.waiting import wait_until
from tests.conftest import Backend

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
        spread = random.Random(15)  # the same hour on every run
        for job_id in [*ids["history_ok"], *ids["history_dead"]]:
            ago = timedelta(seconds=spread.triangular(60, 3600, 1500))
            age_jobs(queue, [job_id], by=ago)
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


@contextmanager
def serving(app: Any) -> Iterator[str]:
    """``app`` served by uvicorn in a thread, on a socket bound to a port the kernel chose;
    yields its base URL."""
    with listening_socket() as sock:
        port = int(sock.getsockname()[1])
        server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
        )
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()

        def started() -> bool:
            if not thread.is_alive():
                raise AssertionError("uvicorn exited while starting")
            return bool(server.started)

        wait_until(started, timeout=30, what="uvicorn to start")
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            server.should_exit = True
            thread.join(timeout=10)


@contextmanager
def web_command(*arguments: str, log: Path) -> Iterator[int]:
    """``sqlqueue web --port 0 ARGUMENTS`` in a subprocess, its output in ``log``; yields the
    port it reported (uvicorn binds one the kernel chose and names it in its start-up line),
    and stops it when the block ends."""
    command = [*sqlqueue_command(), "web", "--port", "0", *arguments]
    with log.open("wb") as output:
        server = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
    try:

        def reported() -> int | None:
            if server.poll() is not None:
                raise AssertionError(f"sqlqueue web exited: {log.read_text(errors='replace')}")
            return port_in(log.read_text(errors="replace"), r"running on http://[^:]+:(\d+)")

        yield wait_until(reported, timeout=60, what="sqlqueue web to report its port")
    finally:
        server.terminate()
        server.wait(timeout=30)
