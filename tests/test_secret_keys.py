"""Keys derived from secret fields (issue 44, item 2), on every backend, through the public API.

A unique key, a ``Concurrency`` key, a ``RateLimit`` key or a ``CircuitBreaker`` key read from
a field the task declares secret is stored as a keyed hash — an HMAC under a key derived from
the queue's encryption keys — never as the plaintext, nor as a digest anyone can recompute from
a guess; every key function gets the same plaintext payload (``Concurrency``'s and ``Unique``'s
at enqueue, the gates' on the worker); a key that reads no secret field is stored as before;
and a unique job enqueued before a key rotation still blocks its duplicate after it. The
tables are read as someone holding the database would: every row of the jobs, the unique-key
locks, the limit keys, the rate-limit buckets and the circuit breakers, as text.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from typing import Any

import pytest
import sqlalchemy as sa
from cryptography.fernet import Fernet

import sqlqueue
from sqlqueue._schema import circuit_breakers, jobs, limit_keys, rate_limits, unique_keys
from tests._support import count_jobs, drain
from tests.conftest import Backend

pytestmark = pytest.mark.timeout(180)

KEY_A = Fernet.generate_key().decode()
KEY_B = Fernet.generate_key().decode()
#: Every table a key can be stored in, besides the job row itself.
KEY_TABLES = (jobs, unique_keys, limit_keys, rate_limits, circuit_breakers)


def card_number() -> str:
    """A random 16-digit card number: with its BIN and last four known, an unsalted digest of
    it falls to a guess of the eight digits left."""
    return "4242" + "".join(secrets.choice("0123456789") for _ in range(12))


def slices(secret: str, size: int = 8) -> set[str]:
    return {secret[i : i + size] for i in range(len(secret) - size + 1)}


def stored_text(backend: Backend) -> str:
    """Every row of every table a key can be stored in, as text."""
    parts = []
    with backend.engine.connect() as conn:
        for table in KEY_TABLES:
            rows = conn.execute(sa.select(*(sa.cast(column, sa.Text) for column in table.c)))
            parts += [str(value) for row in rows for value in row]
    return "\n".join(parts)


def assert_not_stored(backend: Backend, *secret_values: str) -> None:
    text = stored_text(backend)
    for secret in secret_values:
        found = sorted(piece for piece in slices(secret) if piece in text)
        assert not found, f"slices of a secret are stored: {found}"


def column(backend: Backend, name: str, job_id: int) -> Any:
    with backend.engine.connect() as conn:
        return conn.execute(sa.select(jobs.c[name]).where(jobs.c.id == job_id)).scalar_one()


def keys_of(backend: Backend, table: sa.Table) -> list[str]:
    with backend.engine.connect() as conn:
        return sorted(conn.execute(sa.select(table.c.key)).scalars())


def plaintexts(seen: list[Any]) -> set[str]:
    """The secret values a key function was called with. Never a sealed value; besides the
    plaintext, only the placeholder a second call puts in place of each secret field to learn
    whether the key reads one (see docs/guides/secrets.md), which is no string."""
    assert not any(isinstance(value, dict) for value in seen), seen  # no {"$sqlqueue_secret"}
    return {value for value in seen if isinstance(value, str)}


def plain_digest(job_type: str, values: Any) -> str:
    """The unsalted SHA-256 a unique key used to be: what anyone can compute from a guess."""
    text = json.dumps([job_type, values, None], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def charges(backend: Backend, keys: list[str]) -> tuple[sqlqueue.Queue, sqlqueue.Task]:
    """A queue with ``charge``, unique by its secret ``card`` (a whole secret field)."""
    queue = backend.queue(encryption_keys=keys)

    @queue.task("charge", secret_fields=["card"], unique=sqlqueue.Unique(by=("card",)))
    def charge(card: str, amount: int) -> None:
        return None

    return queue, charge


# -- unique keys ---------------------------------------------------------------------------------


def test_a_unique_key_read_from_a_secret_field_is_an_hmac_no_guess_confirms(
    backend: Backend,
) -> None:
    queue, charge = charges(backend, [KEY_A])

    @queue.task(
        "refund",
        secret_fields=["card.number"],
        unique=sqlqueue.Unique(by=lambda payload: payload["card"]["number"][-4:]),
    )
    def refund(card: dict[str, str], customer: str) -> None:
        return None

    @queue.task("notify", secret_fields=["card"], unique=sqlqueue.Unique(by=("customer",)))
    def notify(card: str, customer: str) -> None:
        return None

    card, other = card_number(), card_number()
    with backend.engine.begin() as conn:
        first = charge.enqueue(conn, card=card, amount=1)
        again = charge.enqueue(conn, card=card, amount=2)
        different = charge.enqueue(conn, card=other, amount=3)
        refunded = refund.enqueue(conn, card={"number": card}, customer="ada")
        refunded_again = refund.enqueue(conn, card={"number": card}, customer="bob")
        notified = notify.enqueue(conn, card=card, customer="ada")

    assert again == first != different
    assert refunded_again == refunded
    key = column(backend, "unique_key", first)
    assert re.fullmatch("[0-9a-f]{64}", key)  # the column and the lock table hold digests
    assert key != plain_digest("charge", [card])  # a guess of the card does not confirm itself
    assert column(backend, "unique_key", refunded) != plain_digest("refund", card[-4:])
    # A key that reads no secret field is the plain digest it always was.
    assert column(backend, "unique_key", notified) == plain_digest("notify", ["ada"])
    assert_not_stored(backend, card, other)

    # The HMAC's key is the queue's: under another encryption key the same card is another
    # key, so the first job does not block it.
    _, charge_elsewhere = charges(backend, [KEY_B])
    with backend.engine.begin() as conn:
        assert charge_elsewhere.enqueue(conn, card=card, amount=4) not in (first, different)


def test_a_unique_job_enqueued_before_a_key_rotation_still_blocks_its_duplicate(
    backend: Backend,
) -> None:
    _, before = charges(backend, [KEY_A])
    _, rotated = charges(backend, [KEY_B, KEY_A])  # the new key first, the old one kept
    _, retired = charges(backend, [KEY_B])  # the old key gone
    card, later_card = card_number(), card_number()
    with backend.engine.begin() as conn:
        first = before.enqueue(conn, card=card, amount=1)
    with backend.engine.begin() as conn:
        assert rotated.enqueue(conn, card=card, amount=2) == first
        later = rotated.enqueue(conn, card=later_card, amount=3)
    assert count_jobs(backend.engine) == 2
    # Enqueued after the rotation: keyed by the new key, which the retired ring still has.
    with backend.engine.begin() as conn:
        assert retired.enqueue(conn, card=later_card, amount=4) == later
    # Once the old key is retired, a job keyed by it is no longer recognised (documented).
    with backend.engine.begin() as conn:
        assert retired.enqueue(conn, card=card, amount=5) not in (first, later)
    assert_not_stored(backend, card, later_card)


# -- concurrency keys ----------------------------------------------------------------------------


def test_a_concurrency_key_read_from_a_secret_field_is_stored_as_an_hmac(
    backend: Backend,
) -> None:
    queue = backend.queue(encryption_keys=[KEY_A])
    seen: list[Any] = []

    def by_card(payload: Any) -> str:
        seen.append(payload["card"])
        return f"card-{payload['card']}"

    @queue.task(
        "charge",
        secret_fields=["card", "token"],
        concurrency=sqlqueue.Concurrency(limit=1, key=by_card),
    )
    def charge(card: str, token: str) -> None:
        return None

    @queue.task(
        "sync",
        secret_fields=["token"],
        concurrency=sqlqueue.Concurrency(limit=1, key=lambda payload: payload["tenant"]),
    )
    def sync(token: str, tenant: str) -> None:
        return None

    card, other, token = card_number(), card_number(), f"tok_{secrets.token_hex(8)}"
    with backend.engine.begin() as conn:
        ids = [
            charge.enqueue(conn, card=card, token=token),
            charge.enqueue(conn, card=card, token=token),
            charge.enqueue(conn, card=other, token=token),
        ]
        synced = sync.enqueue(conn, token=token, tenant="acme")
    drain(queue)

    keys = [column(backend, "limit_key", job_id) for job_id in ids]
    assert keys[0] == keys[1] != keys[2]  # one limit per card, as the key function says
    assert all(re.fullmatch("hmac:[0-9a-f]{64}", key) for key in keys), keys
    assert column(backend, "limit_key", synced) == "acme"  # reads no secret: kept as it is
    with backend.engine.connect() as conn:
        claimed = set(conn.execute(sa.select(limit_keys.c.limit_key)).scalars())
    assert set(keys) <= claimed
    assert plaintexts(seen) == {card, other}, seen
    assert {job.status for job in queue.jobs()} == {"succeeded"}
    assert_not_stored(backend, card, other, token)


# -- rate-limit and circuit-breaker keys ---------------------------------------------------------


def test_gate_keys_read_the_plaintext_and_are_stored_as_hmacs(backend: Backend) -> None:
    queue = backend.queue(encryption_keys=[KEY_A])
    seen: list[Any] = []

    def by_card(payload: Any) -> str:
        number = payload["card"]["number"]
        seen.append(number)
        return f"card:{number}" if isinstance(number, str) else f"card:{number!r}"

    @queue.task(
        "charge",
        secret_fields=["card.number"],
        rate_limit=sqlqueue.RateLimit(per_second=1000, key=by_card),
        circuit_breaker=sqlqueue.CircuitBreaker(key=by_card),
        concurrency=sqlqueue.Concurrency(limit=5, key=by_card),
        max_attempts=1,
    )
    def charge(card: dict[str, str], down: bool = False) -> None:
        if down:  # a failure the breaker counts: it writes the breaker's row
            raise ConnectionError(f"the gateway is down for card {card['number']}")

    @queue.task(
        "ping",
        secret_fields=["token"],
        rate_limit=sqlqueue.RateLimit(per_second=1000, key=lambda payload: payload["host"]),
        circuit_breaker=sqlqueue.CircuitBreaker(key=lambda payload: payload["host"]),
        max_attempts=1,
    )
    def ping(token: str, host: str) -> None:
        raise ConnectionError("api.example is down")

    card, other = card_number(), card_number()
    with backend.engine.begin() as conn:
        ids = [
            charge.enqueue(conn, card={"number": card, "brand": "visa"}, down=down)
            for down in (True, False, False)
        ]
        ids.append(charge.enqueue(conn, card={"number": other, "brand": "visa"}, down=True))
        pinged = ping.enqueue(conn, token="tok_ping_secret", host="api.example")
    drain(queue)

    statuses = {job.id: job.status for job in queue.jobs()}
    assert statuses == {ids[0]: "dead", ids[1]: "succeeded", ids[2]: "succeeded"} | {
        ids[3]: "dead",
        pinged: "dead",
    }
    # Every key function saw the plaintext: at enqueue (Concurrency) and on the worker (gates).
    assert plaintexts(seen) == {card, other}, seen
    assert len([value for value in seen if isinstance(value, str)]) >= 3 * len(ids)
    # One bucket and one breaker per card (not one per job's ciphertext), each under its HMAC;
    # the key that reads no secret field is stored as it is.
    for table in (rate_limits, circuit_breakers):
        keys = keys_of(backend, table)
        hashed = [key for key in keys if key != "api.example"]
        assert len(keys) == 3, keys
        assert all(re.fullmatch("hmac:[0-9a-f]{64}", key) for key in hashed), keys
    assert set(keys_of(backend, rate_limits)) == set(keys_of(backend, circuit_breakers))
    assert {column(backend, "limit_key", job_id) for job_id in ids} <= set(
        keys_of(backend, rate_limits)
    )
    assert_not_stored(backend, card, other, "tok_ping_secret")
