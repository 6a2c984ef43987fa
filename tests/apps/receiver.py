"""A real HTTP server for the webhook tests: it listens on 127.0.0.1, answers each path from a
script, and records every request (and every connection) it sees.

A reply can be any status with headers and body, an answer slower than the sender's timeout,
an answer held until the test releases it (so "it never answered while the test looked" is
certain, however slow the machine), or a reset connection (SO_LINGER 0, so the peer gets RST,
not FIN).
"""

from __future__ import annotations

import socket
import ssl
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["Received", "Receiver", "Reply", "running_receiver"]


@dataclass(frozen=True)
class Reply:
    """One scripted answer."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b"ok"
    delay: float = 0.0
    #: Answer only once the receiver is released (:meth:`Receiver.release`, or the end of
    #: :func:`running_receiver`'s block).
    hold: bool = False
    reset: bool = False


@dataclass(frozen=True)
class Received:
    """One request as the server got it (header names lower-cased)."""

    path: str
    headers: dict[str, str]
    body: bytes
    at: float


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    receiver: Receiver

    def verify_request(self, request: Any, client_address: Any) -> bool:
        self.receiver.connections += 1
        return True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that gave up (timeout) makes writes fail: expected, not noise."""


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        """Silent: the tests read :attr:`Receiver.requests` instead."""

    def do_POST(self) -> None:
        receiver = self.server.receiver
        length = int(self.headers.get("content-length", "0"))
        body = self.rfile.read(length)
        headers = {name.lower(): value for name, value in self.headers.items()}
        reply = receiver.next_reply(self.path, Received(self.path, headers, body, time.time()))
        try:
            self._answer(reply)
        finally:
            receiver.done(self.path)

    def _answer(self, reply: Reply) -> None:
        if reply.hold:
            self.server.receiver.released.wait()
        if reply.delay:
            time.sleep(reply.delay)
        if reply.reset:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
            self.close_connection = True
            return
        self.send_response(reply.status)
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.send_header("content-length", str(len(reply.body)))
        self.end_headers()
        self.wfile.write(reply.body)


class Receiver:
    """The server's script and records; ``url(path)`` is where to send."""

    def __init__(self, server: _Server) -> None:
        self._server = server
        self._lock = threading.Lock()
        self._scripts: dict[str, list[Reply]] = {}
        self.requests: list[Received] = []
        self.connections = 0
        self._active: dict[str, int] = {}
        #: The most requests to each path that were being answered at the same time.
        self.peak: dict[str, int] = {}
        #: Set once held replies may answer.
        self.released = threading.Event()

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def url(self, path: str, host: str = "127.0.0.1", scheme: str = "http") -> str:
        return f"{scheme}://{host}:{self.port}{path}"

    def script(self, path: str, *replies: Reply) -> None:
        """Answer requests to ``path`` with ``replies`` in turn; the last one repeats."""
        with self._lock:
            self._scripts[path] = list(replies)

    def next_reply(self, path: str, request: Received) -> Reply:
        with self._lock:
            self.requests.append(request)
            active = self._active[path] = self._active.get(path, 0) + 1
            self.peak[path] = max(self.peak.get(path, 0), active)
            script = self._scripts.get(path, [Reply(status=404, body=b"no script")])
            return script.pop(0) if len(script) > 1 else script[0]

    def done(self, path: str) -> None:
        """A request to ``path`` has been answered (or its connection reset)."""
        with self._lock:
            self._active[path] -= 1

    def received(self, path: str) -> list[Received]:
        with self._lock:
            return [request for request in self.requests if request.path == path]

    def release(self) -> None:
        """Let every held reply answer, now and from now on."""
        self.released.set()


@contextmanager
def running_receiver(tls: ssl.SSLContext | None = None) -> Iterator[Receiver]:
    """A receiver serving on a free port of 127.0.0.1 until the block ends (HTTPS with the
    server-side context ``tls``)."""
    server = _Server(("127.0.0.1", 0), _Handler)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    receiver = Receiver(server)
    server.receiver = receiver
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.daemon = True
    thread.start()
    try:
        yield receiver
    finally:
        receiver.release()
        server.shutdown()
        server.server_close()
        thread.join(5)
