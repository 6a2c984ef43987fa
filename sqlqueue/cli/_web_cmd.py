"""``sqlqueue web``: serve the internal web page on this machine, after checking in one line
that its port can be listened on. Starlette, Jinja2 and uvicorn load only for this command."""

from __future__ import annotations

import argparse
import os
import socket
from typing import TYPE_CHECKING

from sqlqueue.cli._common import UsageError

if TYPE_CHECKING:  # the parser loads this module: no SQLAlchemy before a command runs
    from sqlqueue._queue import Queue

__all__ = ["serve_web"]


def serve_web(queue: Queue, args: argparse.Namespace) -> int:
    """Serve the web page on ``queue`` until interrupted; returns the exit status."""
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be between 0 and 65535, got {args.port}")
    check_port_free(args.host, args.port)
    try:  # Starlette, Jinja2 and uvicorn load only for this command
        from sqlqueue.web._serve import serve
    except ImportError as error:
        raise UsageError(
            f'the web page needs its extra: pip install "sqlalchemy-sqlqueue[web]" ({error})'
        ) from None
    serve(
        queue,
        host=args.host,
        port=args.port,
        read_only=args.read_only,
        allowed_hosts=args.allowed_host or _default_hosts(args.host, args.port),
    )
    return 0


def _default_hosts(host: str, port: int) -> list[str]:
    """The hosts ``sqlqueue web`` answers without ``--allowed-host``: its address and
    ``localhost``, on its port (any port when the port is chosen at start, ``--port 0``)."""
    names = [f"[{host}]" if ":" in host else host, "localhost"]
    return names if port == 0 else [f"{name}:{port}" for name in names]


def check_port_free(host: str, port: int) -> None:
    """A usage error, in one line, if ``host:port`` cannot be listened on (taken by another
    process, or an address not of this machine); checked before the server starts, whose own
    error would be a log record and a traceback."""
    if port == 0:
        return  # any free port
    try:
        family, *_, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        with socket.create_server(address[:2], family=family):
            pass
    except OSError as error:  # socket.gaierror included
        reason = os.strerror(error.errno) if error.errno else str(error)
        raise UsageError(
            f"--port: cannot listen on {host}:{port} ({reason}): stop what uses it or "
            "pick another --port"
        ) from None
