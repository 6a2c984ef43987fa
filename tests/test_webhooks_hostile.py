"""The webhook kind's defences, tried the way a deliberately broken build showed they must be:
the SSRF guard judges *every* address a name resolves to (a name answering a public and a
private address, in both orders); ``verify()`` compares signatures in constant time (a spy on
``hmac.compare_digest``); a ``webhook-timestamp`` is ASCII digits only; and a URL's password
never shows in an error, whatever it holds.

The resolver is the real ``socket.getaddrinfo`` with answers for names under ``.test``
injected; nothing here connects anywhere (``resolve()`` only resolves).
"""

from __future__ import annotations

import asyncio
import hmac
import socket
from datetime import UTC, datetime
from typing import Any

import pytest
import standardwebhooks

import sqlqueue
from sqlqueue._scrub import hide_passwords
from sqlqueue.cli._common import UsageError
from sqlqueue.cli._engine import open_engine
from sqlqueue.webhooks import DeliveryRefused, WebhookVerificationError, verify
from sqlqueue.webhooks._guard import resolve
from sqlqueue.webhooks._webhooks import _check_url

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
PUBLIC = "93.184.215.14"  # a global address: only ever resolved here, never connected to


@pytest.fixture
def answers(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """Names under ``.test`` resolve to the addresses put here, in that order."""
    table: dict[str, list[str]] = {}
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(host, str) and host in table:
            return [
                (
                    socket.AF_INET6 if ":" in address else socket.AF_INET,
                    socket.SOCK_STREAM,
                    socket.IPPROTO_TCP,
                    "",
                    (address, port, 0, 0) if ":" in address else (address, port),
                )
                for address in table[host]
            ]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return table


@pytest.mark.parametrize(
    "addresses",
    [
        [PUBLIC, "127.0.0.1"],
        ["127.0.0.1", PUBLIC],
        [PUBLIC, "10.1.2.3"],
        ["169.254.169.254", PUBLIC],  # the cloud metadata service
        [PUBLIC, "::ffff:192.168.1.1"],  # a private IPv4 inside an IPv6 answer
        [PUBLIC, PUBLIC.replace("14", "15"), "::1"],  # the private one last of three
    ],
    ids=["public-loopback", "loopback-public", "public-rfc1918", "metadata-public",
         "public-mapped", "two-public-then-v6-loopback"],
)  # fmt: skip
def test_a_name_with_any_private_answer_is_refused_in_any_order(
    answers: dict[str, list[str]], addresses: list[str]
) -> None:
    answers["mixed.test"] = addresses
    with pytest.raises(DeliveryRefused, match=r"mixed\.test resolves to"):
        asyncio.run(resolve("mixed.test", 443, allow_private=False))


def test_a_name_with_only_public_answers_resolves_to_its_first(
    answers: dict[str, list[str]],
) -> None:
    answers["public.test"] = [PUBLIC, PUBLIC.replace("14", "15")]
    assert str(asyncio.run(resolve("public.test", 443, allow_private=False))) == PUBLIC


# -- verify(): constant time, exact timestamps -------------------------------------------------


def _signed(body: str, at: datetime, message_id: str = "msg_1") -> dict[str, str]:
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": standardwebhooks.Webhook(SECRET).sign(message_id, at, body),
    }


def test_verify_compares_every_signature_with_compare_digest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: Any, b: Any) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)  # the module _signing calls through
    body = '{"a":1}'
    headers = _signed(body, datetime.now(UTC))
    headers["webhook-signature"] = "v1,AAAA " + headers["webhook-signature"]  # two offered
    assert verify(SECRET, headers, body) == {"a": 1}
    assert len(calls) == 2  # each offered signature, no early exit
    assert all(isinstance(a, bytes) and isinstance(b, bytes) for a, b in calls)
    calls.clear()
    with pytest.raises(WebhookVerificationError, match="no matching signature"):
        verify(SECRET, headers, '{"a":2}')
    assert len(calls) == 2


@pytest.mark.parametrize(
    "shape",
    [" {}", "+{}", "{}\n", "0{}", "{}.0", "\u0661\u0667\u0669{}"],
    ids=["space", "plus", "newline", "leading-zero", "fraction", "arabic-indic-digits"],
)
def test_a_timestamp_other_than_ascii_digits_is_refused(shape: str) -> None:
    body = "{}"
    now = datetime.now(UTC)
    headers = _signed(body, now)
    headers["webhook-timestamp"] = shape.format(headers["webhook-timestamp"])
    with pytest.raises(WebhookVerificationError, match="ASCII digits"):
        verify(SECRET, headers, body)


def test_a_timestamp_with_underscores_is_refused() -> None:
    body = "{}"
    headers = _signed(body, datetime.now(UTC))
    stamp = headers["webhook-timestamp"]
    headers["webhook-timestamp"] = f"{stamp[0]}_{stamp[1:4]}_{stamp[4:]}"
    assert int(headers["webhook-timestamp"]) == int(stamp)  # what int() alone accepted
    with pytest.raises(WebhookVerificationError, match="ASCII digits"):
        verify(SECRET, headers, body)


# -- a URL's password, whatever it holds, never shows ------------------------------------------

PASSWORDS = ["p@Zq9", "s3:cR@tX@", "aQ@b/c?dW", "@@@", "xK%40y@zJ"]


@pytest.mark.parametrize("password", PASSWORDS)
def test_a_database_url_password_with_an_at_sign_never_shows(password: str) -> None:
    url = f"postgresql+psycopg://app:{password}@127.0.0.1:1/db"
    with pytest.raises(UsageError) as raised:
        open_engine(url)
    message = str(raised.value)
    assert "percent-encode" in message
    for piece in {password, *password.split("@")} - {""}:
        if len(piece) >= 2:
            assert piece not in message.replace("***", "")
    assert "app:***@127.0.0.1" in message


@pytest.mark.parametrize("password", PASSWORDS)
def test_a_webhook_url_with_credentials_is_refused_without_showing_them(
    password: str,
) -> None:
    url = f"https://hook:{password}@example.com/in"
    shown = hide_passwords(repr(url))
    assert password not in shown
    assert "hook:***@example.com" in shown
    with pytest.raises(sqlqueue.ConfigurationError, match="credentials") as raised:
        _check_url(url)
    for piece in {password, *password.split("@")} - {""}:
        if len(piece) >= 2:
            assert piece not in str(raised.value).replace("***", "")
