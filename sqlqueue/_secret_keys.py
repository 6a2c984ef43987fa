"""Keys derived from secret fields: stored as keyed hashes, never as the plaintext.

A task's unique key, its ``Concurrency`` key and its ``RateLimit`` and ``CircuitBreaker`` keys
are all computed from the one plaintext view of its payload (what the handler gets): at enqueue
from the payload as given, on the worker from the claimed payload with its secret fields
decrypted. When one of them depends on a field the task declares secret, what is stored is an
HMAC-SHA256 of it under a key derived from the queue's first encryption key
(:meth:`~sqlqueue._secrets.Keyring.digests`): the unique key is that digest (64 hex digits, like
the plain SHA-256 it replaces); the others are :data:`PREFIX` and the digest. Without the
encryption keys, a digest cannot be brute-forced from the few digits a card number leaves to
guess.

Whether a key depends on a secret field: a ``Unique.by`` name does when it names a secret field
or the object holding one; a key function does when its answer changes, or it raises, once
every secret field of the payload is swapped for an opaque stand-in (it is called a second time,
with that copy). What the stand-in cannot change is no secret (a key that never reads the
field, or reads only that it is there) and is kept as it is, so operators still read it. Only a
task with secret fields pays for any of this; a fixed key string is never hashed.

Keys rotate with the encryption keys. A unique job is looked up under its key's digest by every
configured key (``UniqueCheck.also``), so a duplicate of a job enqueued before the rotation is
still recognised. The other keys are hashed with the current key only: see
docs/guides/secrets.md for what a rotation does to them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from sqlqueue._policies.concurrency import Concurrency
from sqlqueue._secrets import SecretFields
from sqlqueue._unique import Unique, unique_digest, unique_text, unique_values

__all__ = ["PREFIX", "keyed_key", "keyed_limit_key", "reads_a_secret", "secret_unique_keys"]

#: What a stored key that was derived from a secret field starts with (then 64 hex digits).
PREFIX = "hmac:"


class _StandIn:
    """What a secret field holds when a key function is asked again: equal to nothing but
    itself, and of no type a key function expects."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<secret field>"


_STAND_IN = _StandIn()


def reads_a_secret(
    secrets: SecretFields, function: Callable[[Mapping[str, Any]], Any], payload: Any, answer: Any
) -> bool:
    """Whether ``function``'s ``answer`` for ``payload`` depends on a secret field: the answer
    changes, or the call raises, with every secret field of ``payload`` stood in for."""
    stood_in = secrets.stood_in(payload, _STAND_IN)
    if stood_in is payload:  # no secret field in this payload: nothing to depend on
        return False
    try:
        return bool(function(stood_in) != answer)
    except Exception:  # it could not do without the secret: it reads it
        return True


def keyed_key(secrets: SecretFields, text: str) -> str:
    """``text`` (a key derived from a secret field) as it is stored: :data:`PREFIX` and its
    HMAC under the current encryption key."""
    return PREFIX + secrets.keyring.digests(text)[0]


def keyed_limit_key(
    secrets: SecretFields,
    concurrency: Concurrency | None,
    payload: Mapping[str, Any],
    key: str,
) -> str:
    """The ``limit_key`` stored for a job of a task with secret fields whose ``Concurrency``
    key function answered ``key``: that key, or its keyed hash if it reads a secret field."""
    function = concurrency.key if concurrency is not None else None
    if function is not None and reads_a_secret(secrets, function, payload, key):
        return keyed_key(secrets, key)
    return key


def secret_unique_keys(
    secrets: SecretFields, job_type: str, unique: Unique, payload: Mapping[str, Any]
) -> tuple[str, ...]:
    """The unique key of a job of a task with secret fields (its ``by`` function called once,
    and once more to learn whether it reads a secret field). When the key depends on one: the
    HMAC of the key's text under each encryption key, the current one's first (the others are
    what jobs enqueued before a rotation hold). When it does not: the plain digest alone, as
    :func:`~sqlqueue._unique.unique_key` gives it."""
    values = unique_values(job_type, unique, payload)
    text = unique_text(job_type, unique, values)
    if callable(unique.by):
        secret = reads_a_secret(secrets, unique.by, payload, values)
    else:
        holders = {path[0] for path in secrets.paths}
        secret = any(name in holders for name in unique.by)
    if not secret:
        return (unique_digest(text),)
    return secrets.keyring.digests(text)
