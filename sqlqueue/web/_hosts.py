"""The hosts the page is served as, against DNS rebinding: a site the operator visits can point
its own name at 127.0.0.1 and have the browser read the page as its own — but the browser still
sends that name in the ``Host`` header, so a page that answers only the names it is served as
(``localhost``, ``127.0.0.1``, ``ops.example.com:8443`` …) gives such a site nothing.

An entry is a name or an IP address, with a port (``localhost:8080``, ``[::1]:8080``) or
without one (any port); ``*`` allows every host (only behind a proxy that checks ``Host``
itself)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from sqlqueue._errors import ConfigurationError

__all__ = ["DEFAULT_ALLOWED_HOSTS", "AllowedHosts", "HostPort", "default_port", "parse_host"]

#: Who may reach the page when the host names nobody: this machine under its loopback names.
DEFAULT_ALLOWED_HOSTS = ("localhost", "127.0.0.1", "::1")

# A DNS name or an IPv4 address, or (inside brackets, or bare with two colons or more) IPv6.
_NAME = re.compile(r"[a-z0-9_]([a-z0-9_.-]*[a-z0-9_])?")
_IPV6 = re.compile(r"[0-9a-f:.]+")
_PORT = re.compile(r"[0-9]{1,5}")


def default_port(scheme: str) -> int:
    """The port a URL of ``scheme`` means when it names none."""
    return 443 if scheme in ("https", "wss") else 80


@dataclass(frozen=True, kw_only=True)
class HostPort:
    """A host name (lower case, no trailing dot, IPv6 without brackets) and its port, if any."""

    name: str
    port: int | None = None

    def __str__(self) -> str:
        name = f"[{self.name}]" if ":" in self.name else self.name
        return name if self.port is None else f"{name}:{self.port}"


def parse_host(text: str) -> HostPort | None:
    """``name``, ``name:port``, ``[v6]``, ``[v6]:port`` or a bare IPv6 address as a
    :class:`HostPort`; ``None`` when ``text`` is none of these (a URL, a path, spaces …)."""
    text = text.lower()
    port_text: str | None = None
    if text.startswith("["):
        name, bracket, rest = text[1:].partition("]")
        if not bracket or not _IPV6.fullmatch(name) or (rest and not rest.startswith(":")):
            return None
        port_text = rest[1:] if rest else None
    elif text.count(":") > 1:
        name = text
        if not _IPV6.fullmatch(name):
            return None
    else:
        name, colon, rest = text.partition(":")
        name = name.removesuffix(".")
        if not _NAME.fullmatch(name):
            return None
        port_text = rest if colon else None
    if port_text is None:
        return HostPort(name=name)
    if not (port_text.isascii() and _PORT.fullmatch(port_text)) or not 0 < int(port_text) < 65536:
        return None
    return HostPort(name=name, port=int(port_text))


@dataclass(frozen=True, kw_only=True)
class AllowedHosts:
    """The hosts a request may name; see the module's docstring."""

    entries: tuple[HostPort, ...]
    any_host: bool = False

    @classmethod
    def of(cls, hosts: Iterable[str] | None) -> AllowedHosts:
        """``hosts`` as given to ``create_app(allowed_hosts=…)``, checked: ``None`` is
        :data:`DEFAULT_ALLOWED_HOSTS`; a bad entry is a :class:`ConfigurationError` naming it."""
        if hosts is None:
            hosts = DEFAULT_ALLOWED_HOSTS
        if isinstance(hosts, (str, bytes)):
            raise ConfigurationError(
                f"allowed_hosts: expected a list of hosts, got the single {type(hosts).__name__} "
                f"{hosts!r}: write [{hosts!r}]"
            )
        entries: list[HostPort] = []
        any_host = False
        for host in hosts:
            if host == "*":
                any_host = True
                continue
            parsed = parse_host(host) if isinstance(host, str) else None
            if parsed is None:
                raise ConfigurationError(
                    f"allowed_hosts: {host!r} is not a host: expected a name or an address with "
                    "an optional port, such as 'localhost:8080', 'ops.example.com' or "
                    "'[::1]:8080' (no scheme, no path), or '*'"
                )
            entries.append(parsed)
        if not entries and not any_host:
            raise ConfigurationError("allowed_hosts is empty: the page would answer nobody")
        return cls(entries=tuple(dict.fromkeys(entries)), any_host=any_host)

    def allows(self, host: str | None, scheme: str) -> bool:
        """Whether a request to ``host`` (its ``Host`` header) over ``scheme`` is for a host the
        page is served as; a request without a ``Host``, or with a malformed one, is not."""
        if self.any_host:
            return True
        wanted = parse_host(host) if host else None
        if wanted is None:
            return False
        port = default_port(scheme) if wanted.port is None else wanted.port
        return any(
            entry.name == wanted.name and entry.port in (None, port) for entry in self.entries
        )
