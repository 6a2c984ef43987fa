"""Ports without a race: the test never picks a "free" port, closes it and hopes it is still
free when a server binds it. Either the listening socket is bound to port 0 and handed to the
server (uvicorn, aiosmtpd), or the server binds port 0 itself and says which port it got
(``sqlqueue web --port 0``, ``--metrics-port 0``); a port that must refuse connections stays
bound, not listening, for as long as the test needs it.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["listening_socket", "port_in", "refusing_port"]


@contextmanager
def listening_socket(host: str = "127.0.0.1") -> Iterator[socket.socket]:
    """A TCP socket listening on a port of ``host`` the kernel chose, to hand to a server;
    closed when the block ends."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, 0))
        sock.listen(128)
        yield sock
    finally:
        sock.close()


@contextmanager
def refusing_port(host: str = "127.0.0.1") -> Iterator[int]:
    """A port of ``host`` held bound but not listening: every connection to it is refused
    (a server that is down), and nothing else can take it until the block ends."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        yield int(sock.getsockname()[1])


def port_in(text: str, pattern: str) -> int | None:
    """The port a server reported in its log ``text``: ``pattern``'s first group, or ``None``
    while it has not said so yet."""
    found = re.search(pattern, text)
    return int(found.group(1)) if found else None
