"""The email kind's value objects: where to send (``SMTP``) and what (``Content``)."""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field

from sqlqueue import ConfigurationError
from sqlqueue.email._headers import header_problem

__all__ = ["SMTP", "Content"]


@dataclass(frozen=True, kw_only=True)
class SMTP:
    """An SMTP server and how to talk to it.

    ``starttls=True`` upgrades a plain connection (port 587); ``use_tls=True`` speaks TLS from
    the first byte (port 465); not both. ``timeout`` bounds one whole attempt (connect, greet,
    authenticate, send), so a server that hangs costs one attempt, not a worker slot. Give
    ``tls_context`` to trust a private CA. ``pool_size`` connections per worker are kept open
    between messages (checked with NOOP before reuse, closed after ``pool_idle_seconds`` idle);
    the default, 0, opens one connection per message. The password stays here, in the process
    that built the Mailer: it is never written to a job, an error or a log line (it is not in
    ``repr``).
    """

    host: str
    port: int = 587
    starttls: bool = True
    use_tls: bool = False
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    timeout: float = 20.0
    tls_context: ssl.SSLContext | None = field(default=None, repr=False, compare=False)
    #: Connections each worker keeps open between messages (0: one connection per message).
    pool_size: int = 0
    #: How long a kept connection may sit idle before it is closed.
    pool_idle_seconds: float = 30.0

    def __post_init__(self) -> None:
        if not isinstance(self.host, str) or not self.host:
            raise ConfigurationError(f"SMTP.host must be a host name, got {self.host!r}")
        port = self.port
        if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
            raise ConfigurationError(f"SMTP.port must be 1..65535, got {port!r}")
        if self.starttls and self.use_tls:
            raise ConfigurationError(
                "SMTP.starttls and SMTP.use_tls exclude each other: starttls upgrades a plain "
                "connection (port 587), use_tls is TLS from the start (port 465)"
            )
        if (self.username is None) != (self.password is None):
            raise ConfigurationError("SMTP.username and SMTP.password go together (or neither)")
        for name in ("timeout", "pool_idle_seconds"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or not value > 0:
                raise ConfigurationError(f"SMTP.{name} must be > 0 seconds, got {value!r}")
        size = self.pool_size
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ConfigurationError(f"SMTP.pool_size must be an integer >= 0, got {size!r}")

    @property
    def provider(self) -> str:
        """``smtp:host:port``: the default key of the Mailer's rate limit and circuit breaker."""
        return f"smtp:{self.host}:{self.port}"


@dataclass(frozen=True, kw_only=True)
class Content:
    """What a template renders: a subject, a plain-text body and, optionally, an HTML body
    (sent as ``multipart/alternative`` with the text first)."""

    subject: str
    text: str
    html: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.subject, str) or not self.subject.strip():
            raise ConfigurationError(
                f"Content.subject must be non-empty text, got {self.subject!r}"
            )
        problem = header_problem(self.subject)
        if problem is not None:
            raise ConfigurationError(f"Content.subject must be one line: it {problem}")
        if not isinstance(self.text, str):
            raise ConfigurationError(f"Content.text must be text, got {type(self.text).__name__}")
        if self.html is not None and not isinstance(self.html, str):
            raise ConfigurationError(f"Content.html must be text or None, got {self.html!r}")
