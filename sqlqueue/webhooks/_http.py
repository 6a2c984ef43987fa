"""One HTTP attempt of a delivery: resolve and check the address, POST to it, read the answer.

The request goes to the checked IP address itself, with the original host in the ``Host``
header and as the TLS server name (SNI, and the name the certificate is verified against), so
the guard's verdict is about the very address connected to. Redirects are never followed, no
proxy from the environment is used, and only the first 2 KiB of the answer's body are read: a
receiver cannot make a worker download a large (or endless) response.

Everything the receiver wrote that is kept (in the job's result or its error history: the body's
excerpt, the reason phrase, ``Location``, ``Retry-After``, a transport error's text) is scrubbed
as any stored text is (:func:`sqlqueue._scrub.clip`): the endpoint's signing secrets redacted
(a receiver may echo them in a debugging answer), a URL's password hidden, then cut (the body
to its first 1,024 characters), so a secret straddling the cut is not kept in part either.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ssl
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus

import httpx

from sqlqueue._scrub import clip, hide_passwords
from sqlqueue._secrets import Redactor
from sqlqueue.webhooks._guard import resolve
from sqlqueue.webhooks._signing import SECRET_PREFIX

__all__ = ["EXCERPT_BYTES", "EXCERPT_CHARS", "Answer", "post"]

#: How much of a response body is read: more than is kept, so that the cut comes after the
#: redaction and a secret at the edge of what is kept is still recognised.
EXCERPT_BYTES = 2048
#: How much of a response body is kept (in the result or the error history).
EXCERPT_CHARS = 1024
#: How much of any other text of the receiver's is kept (reason phrase, headers, errors).
_TEXT_CHARS = 1024


@dataclass(frozen=True, kw_only=True)
class Answer:
    """What one attempt got: an HTTP status, or ``status=None`` and the transport ``error``
    (timeout, refused or reset connection) that stood in its way."""

    host: str
    status: int | None
    reason: str
    duration: float
    body: str = ""
    retry_after: str | None = None
    location: str | None = None
    error: str | None = None
    timed_out: bool = False

    def describe(self) -> str:
        """``503 Service Unavailable from crm.example.com after 10.0 s`` and the like."""
        after = f"after {self.duration:.1f} s"
        if self.timed_out:
            return f"no answer from {self.host} {after} ({self.error})"
        if self.status is None:
            return f"{self.error} talking to {self.host} {after}"
        return f"{self.status} {self.reason} from {self.host} {after}".replace("  ", " ")

    def details(self) -> dict[str, object]:
        """The facts kept in the job's history: status, duration, body excerpt …"""
        details: dict[str, object] = {
            "status": self.status,
            "duration_seconds": round(self.duration, 3),
            "body": self.body,
            "host": self.host,
        }
        for name in ("retry_after", "location", "error"):
            value = getattr(self, name)
            if value is not None:
                details[name] = value
        return details


async def post(
    url: str,
    *,
    headers: Mapping[str, str],
    body: bytes,
    timeout: float,
    allow_private: bool,
    ssl_context: ssl.SSLContext,
    secrets: Sequence[str] = (),
) -> Answer:
    """POST ``body`` to ``url`` within ``timeout`` seconds in all (lookup, connection, answer).

    Raises :class:`~sqlqueue.webhooks.DeliveryRefused` when the guard refuses the address
    (nothing is sent) and :class:`~sqlqueue.webhooks.DeliveryFailed` when the name does not
    resolve; any other outcome is an :class:`Answer`, its texts scrubbed of ``secrets`` (the
    endpoint's signing secrets) and of URL passwords.
    """
    answer = await _post(
        url,
        headers=headers,
        body=body,
        timeout=timeout,
        allow_private=allow_private,
        ssl_context=ssl_context,
    )
    return _scrubbed(answer, secrets)


def _scrubbed(answer: Answer, secrets: Sequence[str]) -> Answer:
    """``answer`` with every text the receiver wrote redacted, then cut."""
    redactor = Redactor.of(
        [form for secret in secrets for form in (secret, secret.removeprefix(SECRET_PREFIX))]
    )

    def scrub(text: str | None, limit: int = _TEXT_CHARS) -> str | None:
        if text is None:
            return None
        return clip(hide_passwords(text), limit, redactor=redactor)

    return dataclasses.replace(
        answer,
        reason=scrub(answer.reason) or "",
        body=scrub(answer.body, EXCERPT_CHARS) or "",
        retry_after=scrub(answer.retry_after),
        location=scrub(answer.location),
        error=scrub(answer.error),
    )


async def _post(
    url: str,
    *,
    headers: Mapping[str, str],
    body: bytes,
    timeout: float,
    allow_private: bool,
    ssl_context: ssl.SSLContext,
) -> Answer:
    """:func:`post`, the answer's texts as the receiver sent them."""
    target = httpx.URL(url)
    host = target.host
    started = time.monotonic()

    def elapsed() -> float:
        return time.monotonic() - started

    try:
        async with asyncio.timeout(timeout):
            port = target.port or (443 if target.scheme == "https" else 80)
            name = target.raw_host.decode("ascii")  # IDNA-encoded, as DNS and TLS want it
            address = await resolve(name, port, allow_private=allow_private)
            request_headers = {**headers, "host": target.netloc.decode("ascii")}
            extensions = {"sni_hostname": name}
            async with (
                httpx.AsyncClient(
                    timeout=timeout, follow_redirects=False, trust_env=False, verify=ssl_context
                ) as client,
                client.stream(
                    "POST",
                    target.copy_with(host=str(address)),
                    content=body,
                    headers=request_headers,
                    extensions=extensions,
                ) as response,
            ):
                excerpt = await _excerpt(response)
                return Answer(
                    host=host,
                    status=response.status_code,
                    reason=response.reason_phrase or _phrase(response.status_code),
                    duration=elapsed(),
                    body=excerpt,
                    retry_after=response.headers.get("retry-after"),
                    location=response.headers.get("location"),
                )
    except (TimeoutError, httpx.TimeoutException) as error:
        kind = f"{type(error).__name__}: " if isinstance(error, httpx.TimeoutException) else ""
        return Answer(
            host=host,
            status=None,
            reason="",
            duration=elapsed(),
            error=f"{kind}the {timeout:g} s timeout passed",
            timed_out=True,
        )
    except httpx.TransportError as error:
        return Answer(
            host=host,
            status=None,
            reason="",
            duration=elapsed(),
            error=f"{type(error).__name__}: {error}" if str(error) else type(error).__name__,
        )


async def _excerpt(response: httpx.Response) -> str:
    """The first :data:`EXCERPT_BYTES` of the (decoded) body, as text; the rest is not read.
    (:func:`_scrubbed` keeps :data:`EXCERPT_CHARS` of it.)"""
    kept = bytearray()
    async for chunk in response.aiter_bytes():
        kept += chunk
        if len(kept) >= EXCERPT_BYTES:
            break
    return bytes(kept[:EXCERPT_BYTES]).decode("utf-8", "replace")


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""
