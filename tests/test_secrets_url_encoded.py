"""A secret field that an HTTP library URL-encodes before it reaches an error message is
redacted too, in the forms ``urllib.parse.quote`` and ``quote_plus``/``urlencode`` write (the
query strings httpx's ``params=`` and requests build). A handler POSTs its secret token to a
real HTTP server on 127.0.0.1, which refuses it (404); httpx's error quotes the URL; the stored
error holds ``***`` in its place, not the token in any of those forms.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from urllib.parse import quote, quote_plus, urlencode

import httpx
import pytest
from cryptography.fernet import Fernet

from sqlqueue._scrub import url_encoded
from sqlqueue._secrets import Redactor
from tests._support import drain
from tests.apps.receiver import Receiver, running_receiver
from tests.conftest import Backend

pytestmark = pytest.mark.timeout(60)

KEY = Fernet.generate_key().decode()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with running_receiver() as server:
        yield server


def a_token() -> str:
    """A secret holding characters every URL encoding changes (and a non-ASCII one)."""
    return f"tok/{secrets.token_hex(8)}+&=@ é?"


def forms(token: str) -> list[str]:
    """The token as URLs carry it: as urllib, urlencode and httpx write it."""
    query = httpx.URL("http://127.0.0.1/cb", params={"token": token}).query.decode()
    return [
        token,
        quote(token),
        quote(token, safe=""),
        quote_plus(token),
        urlencode({"token": token}).partition("=")[2],
        query.partition("=")[2],
    ]


def test_the_url_encoded_forms_are_among_a_secrets_needles() -> None:
    token = a_token()
    redactor = Redactor.of([token])
    for form in forms(token):
        assert form in url_encoded(token) or form == token
        assert redactor.text(f"POST /cb?token={form} refused") == "POST /cb?token=*** refused"


@pytest.mark.backend_independent("the redaction of an error's text")
def test_a_secret_in_a_refused_requests_url_is_stored_redacted(
    backend: Backend, receiver: Receiver
) -> None:
    queue = backend.queue(encryption_keys=[KEY])
    url = receiver.url("/cb")  # the receiver answers 404 to any path it has no script for

    @queue.task("notify", secret_fields=["token"], max_attempts=1)
    def notify(token: str) -> None:
        httpx.post(url, params={"token": token}, timeout=10).raise_for_status()

    @queue.task("fetch", secret_fields=["token"], max_attempts=1)
    def fetch(token: str) -> None:
        httpx.post(f"{url}/{quote(token, safe='')}", timeout=10).raise_for_status()

    token, other = a_token(), a_token()
    with backend.engine.begin() as conn:
        ids = [notify.enqueue(conn, token=token), fetch.enqueue(conn, token=other)]
    drain(queue)

    # the tokens reached the server URL-encoded, and so did the URLs httpx's errors quote
    paths = sorted(request.path for request in receiver.requests)
    assert paths == sorted([f"/cb?token={quote_plus(token)}", f"/cb/{quote(other, safe='')}"])
    for job_id, secret in zip(ids, (token, other), strict=True):
        job = queue.get_job(job_id)
        assert job is not None
        assert job.status == "dead"
        text = "\n".join([job.last_error or "", *(str(e.details) for e in job.errors)])
        assert "HTTPStatusError" in text
        assert "***" in text
        for form in forms(secret):
            assert form not in text, form
