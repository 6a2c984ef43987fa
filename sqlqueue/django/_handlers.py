"""Django's connections around each handler, on the handler's thread.

A worker lives for days without Django's request cycle, which is what closes a connection
that broke or outlived ``CONN_MAX_AGE`` (``close_old_connections`` when a request starts and
ends). A sync handler's thread therefore does the same around each handler: a connection the
server dropped between two jobs is replaced instead of failing the next one. In a test whose
queue runs on a lent connection (``_shared.py``), the handler gets that connection instead,
and Django's test client's rule holds: nothing closes the test's connection.

Async handlers run on the worker's event loop, where Django's ORM refuses to run; this
middleware wraps sync handlers only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db import close_old_connections

from sqlqueue._middleware import Middleware
from sqlqueue.django._shared import SharedConnection

__all__ = ["django_connections"]


def django_connections(lent: Callable[[], SharedConnection | None]) -> Middleware:
    """The middleware: ``lent()`` is the connection lent to the queue now, if any."""

    def django_connections(job: Any, call_next: Callable[[], Any]) -> Any:
        shared = lent()
        if shared is not None:
            with shared.lent():
                return call_next()
        close_old_connections()
        try:
            return call_next()
        finally:
            close_old_connections()

    return django_connections
