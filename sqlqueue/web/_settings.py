"""What the host decides about the web page: who may see and do what, who is acting, and
whether the page only reads. One object, kept on the app's state for every request."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from starlette.exceptions import HTTPException
from starlette.requests import Request

from sqlqueue._queue import Queue

__all__ = [
    "ACTIONS",
    "Action",
    "Authorize",
    "CurrentUser",
    "WebSettings",
    "everyone",
    "settings_of",
    "web_user",
]

#: What ``authorize(request, action)`` is asked: seeing the pages, and each kind of change
#: (``"retry"``: make a waiting job due now; ``"reschedule"``: give it another run time).
Action = Literal["view", "requeue", "discard", "pause", "cancel", "retry", "reschedule"]
ACTIONS: tuple[Action, ...] = (
    "view",
    "requeue",
    "discard",
    "pause",
    "cancel",
    "retry",
    "reschedule",
)

#: ``authorize(request, action) -> bool``: may this request do ``action``?
Authorize = Callable[[Request, str], bool]
#: ``current_user(request) -> str``: who acts, recorded on every job an action changes.
CurrentUser = Callable[[Request], str]


def everyone(request: Request, action: str) -> bool:
    """The default ``authorize``: everyone may do everything (put the app behind a login)."""
    return True


def web_user(request: Request) -> str:
    """The default ``current_user``: every action is recorded as by ``"web"``."""
    return "web"


@dataclass(frozen=True, kw_only=True)
class WebSettings:
    """The queue the page operates and the host's decisions about it."""

    queue: Queue
    authorize: Authorize = everyone
    current_user: CurrentUser = web_user
    read_only: bool = False
    max_queued_age: float = 300.0
    refresh_seconds: float = 5.0
    #: The key that signs the forms' CSRF tokens (see :mod:`sqlqueue.web._csrf`).
    secret_key: bytes = field(repr=False)

    def may(self, request: Request, action: Action) -> bool:
        """Whether ``request`` may do ``action``: changes never on a read-only page. Only
        ``True`` allows: anything else from ``authorize`` (a coroutine of an ``async def``
        is truthy) is the host's mistake, raised rather than read as a yes."""
        if action != "view" and self.read_only:
            return False
        answer = self.authorize(request, action)
        if not isinstance(answer, bool):
            raise TypeError(
                f"authorize(request, {action!r}) must return True or False, got {answer!r}"
            )
        return answer

    def require(self, request: Request, action: Action) -> None:
        """403 unless ``request`` may do ``action``."""
        if not self.may(request, action):
            what = (
                "this page is read-only"
                if self.read_only and action != "view"
                else (f"you may not {action} here")
            )
            raise HTTPException(403, what)

    def who(self, request: Request) -> str:
        """Who acts, as the host names them (``by`` on the jobs an action changes)."""
        user = self.current_user(request)
        if not isinstance(user, str) or not user:
            raise TypeError(f"current_user(request) must return a non-empty str, got {user!r}")
        return user


def settings_of(request: Request) -> WebSettings:
    """The settings of the app serving ``request``."""
    settings: WebSettings = request.app.state.sqlqueue
    return settings
