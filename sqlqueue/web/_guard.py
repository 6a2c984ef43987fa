"""What every HTTP request to the page passes first and every response leaves with: a request
for a host the page is not served as is a 400 that shows nothing (DNS rebinding, see
:mod:`sqlqueue.web._hosts`), and every response — page, asset, redirect, error — carries the
headers that keep it out of frames and other sites' hands."""

from __future__ import annotations

from starlette.datastructures import Headers, MutableHeaders
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sqlqueue.web._hosts import AllowedHosts

__all__ = ["SECURITY_HEADERS", "Guard"]

#: Sent with every response: no framing (``X-Frame-Options`` for older browsers, and
#: ``frame-ancestors`` in the CSP), only the page's own stylesheet, script and form targets,
#: no type sniffing, and no full URL (with its filter) in the ``Referer`` to another site.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
        "frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}


class Guard:
    """ASGI middleware: refuses requests for hosts ``allowed`` does not name, and adds
    :data:`SECURITY_HEADERS` to every response."""

    def __init__(self, app: ASGIApp, *, allowed: AllowedHosts) -> None:
        self.app = app
        self.allowed = allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # the lifespan; the page has no websockets
            await self.app(scope, receive, send)
            return

        async def send_guarded(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    headers[name] = value
            await send(message)

        host = Headers(scope=scope).get("host")
        if not self.allowed.allows(host, scope.get("scheme", "http")):
            shown = "no Host header" if host is None else f"the host {host[:200]!r}"
            refusal = PlainTextResponse(
                f"400 Bad Request: this page is not served as {shown}. If that is how you reach "
                "it, add the host to `sqlqueue web --allowed-host` or to "
                "create_app(allowed_hosts=[...]).\n",
                status_code=400,
                headers={"Cache-Control": "no-store"},
            )
            await refusal(scope, receive, send_guarded)
            return
        await self.app(scope, receive, send_guarded)
