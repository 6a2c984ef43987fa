"""A real SMTP server for the email tests: aiosmtpd on a port of 127.0.0.1 the kernel chose (the
listening socket is bound to port 0 and handed to the server: no free-port race), in a thread,
scripted to answer the way a provider would (4xx, 5xx, refused recipients, a dropped
connection), optionally with STARTTLS (a self-signed certificate made here) and AUTH.

Every message it accepts is kept, parsed, in ``received``: the tests count deliveries there.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import socket
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from email import message_from_bytes, policy
from email.message import EmailMessage
from pathlib import Path
from typing import Any

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, AuthResult, LoginPassword

from tests._support.ports import listening_socket

__all__ = ["Received", "SMTPServer", "hung_server", "self_signed_certificate"]


class _BoundController(Controller):
    """aiosmtpd's threaded controller serving on a listening socket bound by the caller (to
    port 0), instead of binding a port number it was given."""

    def __init__(self, handler: Any, sock: socket.socket, **options: Any) -> None:
        self._sock = sock
        super().__init__(handler, hostname="127.0.0.1", port=sock.getsockname()[1], **options)

    def _create_server(self) -> Any:
        return self.loop.create_server(self._factory_invoker, sock=self._sock, ssl=self.ssl_context)

    def factory(self) -> SMTP:
        return _CountingSMTP(self.handler, **self.SMTP_kwargs)


class _CountingSMTP(SMTP):
    """aiosmtpd's server protocol, noting the client address of each connection that ended in
    the handler's ``closed`` (a test waits for the server to drop an idle one, not sleeping)."""

    def connection_lost(self, error: Exception | None) -> None:
        peer = self.session.peer if self.session is not None else None
        super().connection_lost(error)
        with self.event_handler.lock:
            self.event_handler.closed.append(peer)


@dataclass
class Received:
    """One message the server accepted: its envelope, the parsed message, and its bytes as
    they arrived (for what a parser would smooth over: line lengths, control bytes)."""

    sender: str
    recipients: list[str]
    message: EmailMessage
    raw: bytes = b""


@dataclass
class SMTPServer:
    """The scripted server. ``data_replies`` are answered to DATA one by one (then 250);
    ``refuse`` maps a recipient to its RCPT reply; ``refuse_once`` too, for the first RCPT of that
    recipient only (then it is accepted); ``drops`` is how many DATA commands end in a dropped
    connection (nothing delivered)."""

    data_replies: list[str] = field(default_factory=list)
    refuse: dict[str, str] = field(default_factory=dict)
    refuse_once: dict[str, str] = field(default_factory=dict)
    drops: int = 0
    #: Never answer QUIT (after accepting the message).
    hang_at_quit: bool = False
    received: list[Received] = field(default_factory=list)
    logins: list[str] = field(default_factory=list)
    data_commands: int = 0
    #: The client address and port of each accepted message: one per connection used.
    peers: list[Any] = field(default_factory=list)
    #: The client address and port of each connection that ended (closed by either side).
    closed: list[Any] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    async def handle_RCPT(
        self, server: Any, session: Any, envelope: Any, address: str, options: Any
    ) -> str:
        if address in self.refuse:
            return self.refuse[address]
        with self.lock:
            once = self.refuse_once.pop(address, None)
        if once is not None:
            return once
        envelope.rcpt_tos.append(address)
        return "250 2.1.5 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        with self.lock:
            self.data_commands += 1
            if self.drops > 0:
                self.drops -= 1
                server.transport.close()  # the message is lost with the connection
                return "421 4.4.2 connection dropped"
            if self.data_replies:
                return self.data_replies.pop(0)
            self.peers.append(session.peer)
            parsed = message_from_bytes(envelope.content, policy=policy.default)
            assert isinstance(parsed, EmailMessage)
            self.received.append(
                Received(
                    sender=envelope.mail_from,
                    recipients=list(envelope.rcpt_tos),
                    message=parsed,
                    raw=bytes(envelope.original_content or envelope.content),
                )
            )
            return f"250 2.0.0 Ok: queued as Q{len(self.received)}"

    async def handle_QUIT(self, server: Any, session: Any, envelope: Any) -> str:
        if self.hang_at_quit:
            await asyncio.sleep(3600)
        return "221 Bye"

    def authenticate(
        self, server: Any, session: Any, envelope: Any, mechanism: str, auth_data: Any
    ) -> AuthResult:
        """Accept ``app`` / ``s3cret-Pa55`` only."""
        ok = (
            isinstance(auth_data, LoginPassword)
            and auth_data.login == b"app"
            and auth_data.password == b"s3cret-Pa55"
        )
        if ok:
            self.logins.append(auth_data.login.decode())
        return AuthResult(success=ok, handled=False)  # False: aiosmtpd answers 535 itself

    @contextmanager
    def running(
        self, *, tls_context: ssl.SSLContext | None = None, auth: bool = False, **smtp: Any
    ) -> Iterator[int]:
        """Serve on a port the kernel chose (yielded) until the block ends; ``smtp`` goes to
        aiosmtpd's ``SMTP`` (e.g. ``timeout``: how long it lets a connection sit idle)."""
        options: dict[str, Any] = dict(smtp)
        if tls_context is not None:
            options.update(tls_context=tls_context, require_starttls=True)
        if auth:
            options.update(
                authenticator=self.authenticate,
                auth_required=True,
                auth_require_tls=tls_context is not None,
            )
        with listening_socket() as sock:
            controller = _BoundController(self, sock, **options)
            controller.start()
            try:
                yield int(sock.getsockname()[1])
            finally:
                controller.stop()


@contextmanager
def hung_server() -> Iterator[int]:
    """A port whose connections are taken by the kernel and never answered (no greeting)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        yield int(listener.getsockname()[1])


def self_signed_certificate(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, as PEM files in ``directory``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "smtp-cert.pem", directory / "smtp-key.pem"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path
