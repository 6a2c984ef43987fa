"""``sqlqueue web``: the page served standalone by uvicorn, one process, until interrupted."""

from __future__ import annotations

from collections.abc import Sequence

import uvicorn

from sqlqueue._queue import Queue
from sqlqueue.web._app import create_app

__all__ = ["serve"]


def serve(
    queue: Queue, *, host: str, port: int, read_only: bool, allowed_hosts: Sequence[str]
) -> None:
    """Serve ``queue``'s web page on ``host:port`` until SIGINT/SIGTERM, answering only
    requests for ``allowed_hosts``."""
    app = create_app(queue, read_only=read_only, allowed_hosts=allowed_hosts)
    uvicorn.run(app, host=host, port=port, log_level="info")
