"""The internal web page: the queues at a glance, a search of jobs by error, one job's history,
and the dead-letter actions — an ASGI app on the operations API (needs the extra
``sqlalchemy-sqlqueue[web]``).

Serve it standalone with ``sqlqueue web --database-url URL``, or mount the app
:func:`create_app` returns in your own ASGI app under any path prefix.
"""

from __future__ import annotations

from sqlqueue.web._app import create_app
from sqlqueue.web._settings import Authorize, CurrentUser

__all__ = ["Authorize", "CurrentUser", "create_app"]
