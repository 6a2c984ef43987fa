"""Pages from templates: one Jinja2 environment with autoescape on (a job type or an error
holding ``<script>`` renders as text), the helpers templates use (links that work under any
mount prefix, times, durations), and the CSRF token every page hands its forms."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any
from urllib.parse import quote, urlencode

from jinja2 import Environment, PackageLoader, StrictUndefined
from starlette.requests import Request
from starlette.responses import HTMLResponse

from sqlqueue._scrub import shorten
from sqlqueue.web._csrf import FIELD, ensure_cookie, form_token, nonce_for
from sqlqueue.web._settings import ACTIONS, settings_of

__all__ = ["duration", "link", "moment", "pretty_json", "render"]

_ENVIRONMENT = Environment(
    loader=PackageLoader("sqlqueue.web", "templates"),
    autoescape=True,
    undefined=StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)


def link(
    request: Request, name: str, query: Mapping[str, object] | None = None, **path: Any
) -> str:
    """The path of route ``name`` under the app's mount prefix, with the non-empty ``query``
    values; a path, not an absolute URL, so it survives proxies that rewrite the host."""
    # The app's own routes under the request's root_path (where it is mounted), not
    # request.url_for: mounted in a host's Starlette app, the request's router is the host's
    # (which knows our routes only by its mount's name) and its base_url the host's root.
    root: str = request.scope.get("root_path", "")
    where = root.rstrip("/") + str(request.app.router.url_path_for(name, **path))
    params = {key: str(value) for key, value in (query or {}).items() if value not in (None, "")}
    return f"{quote(where)}?{urlencode(params)}" if params else quote(where)


def moment(value: datetime | None) -> str:
    """A time as ``2026-12-01 08:00:05 UTC`` (the database clock's)."""
    if value is None:
        return "—"
    return value.strftime("%Y-%m-%d %H:%M:%S UTC")


def duration(seconds: float | None) -> str:
    """Seconds as ``45 s``, ``12 min``, ``3.5 h``, ``2.0 d``."""
    if seconds is None:
        return "—"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172_800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86_400:.1f} d"


def pretty_json(value: object) -> str:
    """A JSON value indented for reading (the template escapes it)."""
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)


_ENVIRONMENT.filters.update(
    moment=moment, duration=duration, pretty_json=pretty_json, shorten=shorten
)


def render(
    request: Request, template: str, context: Mapping[str, Any], *, status_code: int = 200
) -> HTMLResponse:
    """``template`` rendered for ``request``, with the helpers every page uses: ``url``,
    ``static``, ``may`` (which actions to show), how often lists refresh, the CSRF field, and
    its cookie set."""
    settings = settings_of(request)
    nonce = nonce_for(request)
    allowed = {action: settings.may(request, action) for action in ACTIONS}
    html = _ENVIRONMENT.get_template(template).render(
        request=request,
        url=lambda name, query=None, **path: link(request, name, query, **path),
        static=lambda path: link(request, "static", path=path),
        may=allowed,
        read_only=settings.read_only,
        refresh_seconds=settings.refresh_seconds,
        csrf_field=FIELD,
        csrf_token=form_token(request, settings.secret_key, nonce, time.time()),
        **context,
    )
    response = HTMLResponse(html, status_code=status_code)
    response.headers["Cache-Control"] = "no-store"  # the security headers: see _guard
    ensure_cookie(request, response, nonce)
    return response
