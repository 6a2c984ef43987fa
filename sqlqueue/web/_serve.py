"""``sqlqueue web``: the page served standalone by uvicorn, one process, until interrupted."""

from __future__ import annotations

import uvicorn

from sqlqueue._queue import Queue
from sqlqueue.web._app import create_app

__all__ = ["serve"]


def serve(queue: Queue, *, host: str, port: int, read_only: bool) -> None:
    """Serve ``queue``'s web page on ``host:port`` until SIGINT/SIGTERM."""
    uvicorn.run(create_app(queue, read_only=read_only), host=host, port=port, log_level="info")
