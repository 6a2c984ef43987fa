"""Standard Webhooks signatures: secrets, signing, and :func:`verify` for receivers.

A message is signed as ``v1,`` + base64(HMAC-SHA256(key, "<webhook-id>.<webhook-timestamp>.<body>"))
where ``key`` is the secret ``whsec_<base64>`` decoded. While a secret is being rotated the
sender signs with each current secret and sends the signatures space-separated in one
``webhook-signature`` header; a receiver accepts the message if any of them matches any secret
it holds. Only the standard library is used, so receivers can verify without httpx.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import math
import re
import secrets as _random
import time
from collections.abc import Iterable, Mapping
from typing import Any

from sqlqueue import ConfigurationError
from sqlqueue.webhooks._errors import WebhookVerificationError

__all__ = ["SECRET_PREFIX", "check_secret", "generate_secret", "sign", "signature_header", "verify"]

SECRET_PREFIX = "whsec_"
#: The Standard Webhooks specification asks for keys of 24 to 64 bytes.
_MIN_KEY_BYTES, _MAX_KEY_BYTES = 24, 64


def generate_secret() -> str:
    """A new random secret: ``whsec_`` + base64 of 32 random bytes."""
    return SECRET_PREFIX + base64.b64encode(_random.token_bytes(32)).decode("ascii")


def _key(secret: str) -> bytes:
    """The HMAC key inside ``secret`` (``whsec_`` prefix optional), or ``ValueError``."""
    encoded = secret.removeprefix(SECRET_PREFIX)
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError) as error:
        raise ValueError(f"not base64: {error}") from None


def check_secret(secret: object) -> str:
    """``secret`` if it is a usable signing secret, else a ConfigurationError saying why."""
    if not isinstance(secret, str) or not secret.startswith(SECRET_PREFIX):
        raise ConfigurationError(
            "secret must be a string 'whsec_' + base64 of 24..64 random bytes "
            "(or None to generate one)"
        )
    try:
        key = _key(secret)
    except ValueError as error:
        raise ConfigurationError(f"secret: the part after 'whsec_' is {error}") from None
    if not _MIN_KEY_BYTES <= len(key) <= _MAX_KEY_BYTES:
        raise ConfigurationError(
            f"secret must hold {_MIN_KEY_BYTES}..{_MAX_KEY_BYTES} bytes, got {len(key)}"
        )
    return secret


#: A ``webhook-timestamp`` as :func:`sign` writes it: ASCII digits, no sign, space, underscore
#: or leading zero, at most 12 of them (seconds until the year 33658).
_TIMESTAMP = re.compile(r"0|[1-9][0-9]{0,11}")


def sign(secret: str, message_id: str, timestamp: int, body: bytes) -> str:
    """The ``v1,<base64>`` signature of one message under one secret."""
    signed = b"%s.%d.%s" % (message_id.encode("utf-8"), timestamp, body)
    digest = hmac.new(_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")


def signature_header(secrets: Iterable[str], message_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` value: one signature per current secret, space-separated."""
    return " ".join(sign(secret, message_id, timestamp, body) for secret in secrets)


def verify(
    secret: str | Iterable[str],
    headers: Mapping[str, str],
    body: bytes | str,
    tolerance: float = 300,
    *,
    now: float | None = None,
) -> Any:
    """Check a received webhook and return its parsed JSON payload.

    ``secret`` is the endpoint's secret, or several (during a rotation, any one matching is
    enough). ``headers`` are the request's headers (any mapping; names compared without case)
    and ``body`` its raw bytes, exactly as received. A timestamp more than ``tolerance``
    seconds away from ``now`` (default: this machine's clock) is refused, stale or future, so
    a captured request cannot be replayed later. Signatures are compared in constant time.
    Raises :class:`WebhookVerificationError` saying what is wrong.
    """
    candidates = [secret] if isinstance(secret, str) else list(secret)
    if not candidates:
        raise ConfigurationError("verify needs at least one secret")
    if not math.isfinite(tolerance) or tolerance < 0:
        raise ConfigurationError(f"tolerance must be a number of seconds >= 0, got {tolerance!r}")
    lowered = {name.lower(): value for name, value in headers.items()}
    message_id = lowered.get("webhook-id")
    stamp = lowered.get("webhook-timestamp")
    signatures = lowered.get("webhook-signature")
    if not (message_id and stamp and signatures):
        raise WebhookVerificationError(
            "missing header: webhook-id, webhook-timestamp and webhook-signature are required"
        )
    if not _TIMESTAMP.fullmatch(stamp):
        # int() would take " 179…", "+179…", "1_796_…" and non-ASCII digits: a header other
        # than the one signed. Only the form sign() writes is accepted.
        raise WebhookVerificationError(
            f"webhook-timestamp is not an integer of ASCII digits: {stamp[:40]!r}"
        )
    timestamp = int(stamp)
    current = time.time() if now is None else now
    if timestamp < current - tolerance:
        raise WebhookVerificationError(
            f"message timestamp too old: {current - timestamp:.0f} s ago "
            f"(tolerance {tolerance:g} s)"
        )
    if timestamp > current + tolerance:
        raise WebhookVerificationError(
            f"message timestamp too new: {timestamp - current:.0f} s ahead "
            f"(tolerance {tolerance:g} s)"
        )
    raw = body.encode("utf-8") if isinstance(body, str) else bytes(body)
    offered = _offered_signatures(signatures)
    matched = False
    for candidate in candidates:
        try:
            expected = base64.b64decode(sign(candidate, message_id, timestamp, raw)[3:])
        except ValueError:
            raise ConfigurationError("verify: a secret is not 'whsec_' + base64") from None
        for signature in offered:
            # No early exit: the time taken does not depend on which signature matched.
            matched = hmac.compare_digest(expected, signature) or matched
    if not matched:
        raise WebhookVerificationError("no matching signature: wrong secret or altered message")
    try:
        return json.loads(raw)
    except ValueError as error:
        raise WebhookVerificationError(f"the signed body is not JSON: {error}") from None


def _offered_signatures(header: str) -> list[bytes]:
    """The decoded ``v1`` signatures of a ``webhook-signature`` header (others are skipped:
    unknown versions are for newer schemes, undecodable ones cannot match anyway)."""
    offered = []
    for item in header.split():
        version, _, value = item.partition(",")
        if version != "v1" or not value:
            continue
        try:
            offered.append(base64.b64decode(value, validate=True))
        except (binascii.Error, ValueError):
            continue
    return offered
