"""Cross-site request forgery protection: a POST changes something only when it passes two
checks, each of which refuses on its own (403).

1. **Origin.** Its ``Origin`` header — or, when a browser sent none, its ``Referer`` — names the
   scheme, host and port the request was made to. Browsers set these themselves; a page of
   another origin (another port of the same host, a sibling subdomain) cannot. A POST carrying
   neither is refused: the page cannot tell where it came from.
2. **Token.** Every page sets a random nonce in a cookie and puts into each form a token that
   signs that nonce, the time and the mount path with the server's secret key (HMAC-SHA256).
   Another origin on the same site can plant a cookie of its own (cookies do not separate
   ports, and a sibling subdomain may set them for the parent domain), but without the key it
   cannot make a token that matches it. A token expires after :data:`TOKEN_LIFETIME` seconds.

The key is ``create_app(secret_key=…)``, else ``$SQLQUEUE_WEB_SECRET``, else random bytes made
once per process (then a restart, or another process serving the same page, refuses the forms
of pages loaded before: reload). Signatures are compared in constant time."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
import secrets
from collections.abc import Mapping
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import Response

from sqlqueue._errors import ConfigurationError
from sqlqueue.web._hosts import default_port, parse_host

__all__ = [
    "COOKIE",
    "FIELD",
    "MIN_SECRET_BYTES",
    "SECRET_VARIABLE",
    "TOKEN_LIFETIME",
    "ensure_cookie",
    "form_token",
    "nonce_for",
    "origin_problem",
    "secret_key_of",
    "signature",
    "token_problem",
]

COOKIE = "sqlqueue_csrf"
FIELD = "csrf_token"
SECRET_VARIABLE = "SQLQUEUE_WEB_SECRET"
#: Seconds a page's forms stay valid: a page left open overnight asks to be reloaded.
TOKEN_LIFETIME = 12 * 3600
#: The shortest key accepted: 256 bits, as much as the signature itself.
MIN_SECRET_BYTES = 32
#: How far ahead of the server's clock a token's time may be (another process's clock).
_CLOCK_SKEW = 60

_NONCE = re.compile(r"[A-Za-z0-9_-]{43}")  # secrets.token_urlsafe(32)
_TOKEN = re.compile(r"([0-9]{1,12})\.([A-Za-z0-9_-]{43})")
_PROCESS_KEY = secrets.token_bytes(MIN_SECRET_BYTES)


def secret_key_of(secret_key: str | bytes | None) -> bytes:
    """The key that signs tokens: ``secret_key``, else ``$SQLQUEUE_WEB_SECRET`` (empty is
    unset), else this process's random key. A key shorter than :data:`MIN_SECRET_BYTES` is a
    :class:`ConfigurationError` (that never shows the key)."""
    if secret_key is not None:
        return _checked_key(secret_key, "secret_key")
    from_environment = os.environ.get(SECRET_VARIABLE)
    if from_environment:
        return _checked_key(from_environment, f"${SECRET_VARIABLE}")
    return _PROCESS_KEY


def _checked_key(key: object, name: str) -> bytes:
    if isinstance(key, str):
        key = key.encode()
    if not isinstance(key, bytes):
        raise ConfigurationError(f"{name}: expected str or bytes, got {type(key).__name__}")
    if len(key) < MIN_SECRET_BYTES:
        raise ConfigurationError(
            f"{name} must be at least {MIN_SECRET_BYTES} bytes, got {len(key)}: make one with "
            "python -c 'import secrets; print(secrets.token_urlsafe(32))'"
        )
    return key


def signature(key: bytes, nonce: str, issued: int, scope: str) -> str:
    """The token's signature of ``nonce`` (the cookie's), the time it was ``issued`` (Unix
    seconds) and ``scope`` (the mount path, so that one mount's token is no other's)."""
    message = f"sqlqueue-csrf-v1\x00{scope}\x00{nonce}\x00{issued}".encode()
    digest = hmac.new(key, message, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def _scope(request: Request) -> str:
    root: str = request.scope.get("root_path") or ""
    return root


def nonce_for(request: Request) -> str:
    """The request's nonce: its cookie's when it looks like one of ours, else a new one."""
    existing = request.cookies.get(COOKIE, "")
    return existing if _NONCE.fullmatch(existing) else secrets.token_urlsafe(32)


def form_token(request: Request, key: bytes, nonce: str, now: float) -> str:
    """The token the page's forms carry: the time and its signature with the cookie's nonce."""
    issued = int(now)
    return f"{issued}.{signature(key, nonce, issued, _scope(request))}"


def ensure_cookie(request: Request, response: Response, nonce: str) -> None:
    """Set the nonce's cookie on ``response`` unless the browser sent it already; scoped to
    where the app is mounted, so two mounted pages do not share one."""
    if request.cookies.get(COOKIE) == nonce:
        return
    response.set_cookie(
        COOKIE,
        nonce,
        path=_scope(request) + "/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


def token_problem(
    request: Request, form: Mapping[str, object], key: bytes, now: float
) -> str | None:
    """What is wrong with the form's token for the request's cookie (``None``: nothing)."""
    nonce = request.cookies.get(COOKIE, "")
    sent = form.get(FIELD)
    found = _TOKEN.fullmatch(sent) if isinstance(sent, str) else None
    if found is None or not _NONCE.fullmatch(nonce):
        return "the form's security token is missing or wrong: reload the page and try again"
    issued = int(found.group(1))
    expected = signature(key, nonce, issued, _scope(request))
    if not hmac.compare_digest(expected.encode("ascii"), found.group(2).encode("ascii")):
        return "the form's security token is missing or wrong: reload the page and try again"
    if issued > now + _CLOCK_SKEW or now - issued > TOKEN_LIFETIME:
        hours = TOKEN_LIFETIME // 3600
        return f"the form's security token has expired (after {hours} h): reload the page"
    return None


def _origin_of(url: str, *, whole_url: bool) -> tuple[str, str, int] | None:
    """The scheme, host and port (the default port when it names none) of an ``Origin``
    (``whole_url=False``: nothing after the port) or a ``Referer``; ``None`` when it is not one.
    What a browser never sends — spaces or control characters (which ``urlsplit`` would
    silently drop), a user name — is not one either."""
    if any(character <= " " or character == "\x7f" for character in url):
        return None
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname or "@" in parts.netloc:
        return None
    if not whole_url and (parts.path or parts.query or parts.fragment or url.endswith(("?", "#"))):
        return None
    name = parts.hostname.removesuffix(".")
    return parts.scheme, name, default_port(parts.scheme) if port is None else port


def origin_problem(request: Request) -> str | None:
    """Why the request may not have come from the page itself (``None``: it did): its
    ``Origin``, else its ``Referer``, must name this request's scheme, host and port."""
    scheme = request.url.scheme
    host = parse_host(request.headers.get("host", ""))
    if host is None:  # the Guard refused it already; mounted elsewhere, refuse here too
        return "the request names no host this page can compare its origin with"
    port = default_port(scheme) if host.port is None else host.port
    own = (scheme, host.name, port)
    shown_own = f"{scheme}://{host}"
    origin = request.headers.get("origin")
    referer = request.headers.get("referer")
    if origin is not None:
        sent, what = _origin_of(origin, whole_url=False), f"origin {origin[:200]!r}"
    elif referer is not None:
        sent, what = _origin_of(referer, whole_url=True), f"referer {referer[:200]!r}"
    else:
        return (
            "the request has neither an Origin nor a Referer header, so the page cannot tell "
            "that it comes from itself: send the form from the page, in a browser"
        )
    if sent != own:
        return (
            f"this form was sent from another site ({what}), not from this page "
            f"({shown_own}): only the page itself may change jobs. Behind a proxy that "
            "terminates TLS, let the server see the original scheme (X-Forwarded-Proto)."
        )
    return None
