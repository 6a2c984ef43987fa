"""Cross-site request forgery protection by double submission: every page sets a random token
in a cookie and puts the same token in each form; a POST whose form does not carry the cookie's
token changes nothing (403). Another site can make a browser send the cookie, never read it."""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Mapping

from starlette.requests import Request
from starlette.responses import Response

__all__ = ["COOKIE", "FIELD", "ensure_cookie", "token_for", "valid_token"]

COOKIE = "sqlqueue_csrf"
FIELD = "csrf_token"
_TOKEN_BYTES = 32


def token_for(request: Request) -> str:
    """The request's token: the cookie's when it looks like one of ours, else a new one."""
    existing = request.cookies.get(COOKIE, "")
    if 32 <= len(existing) <= 128 and existing.replace("-", "").replace("_", "").isalnum():
        return existing
    return secrets.token_urlsafe(_TOKEN_BYTES)


def ensure_cookie(request: Request, response: Response, token: str) -> None:
    """Set the token's cookie on ``response`` unless the browser sent it already; scoped to
    where the app is mounted, so two mounted pages do not share one."""
    if request.cookies.get(COOKIE) == token:
        return
    response.set_cookie(
        COOKIE,
        token,
        path=(request.scope.get("root_path") or "") + "/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


def valid_token(request: Request, form: Mapping[str, object]) -> bool:
    """Whether the form carries the token of the request's cookie."""
    cookie = request.cookies.get(COOKIE, "")
    sent = form.get(FIELD)
    if not cookie or not isinstance(sent, str) or not sent:
        return False
    return hmac.compare_digest(cookie.encode(), sent.encode())
