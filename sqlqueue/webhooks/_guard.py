"""The SSRF guard: which addresses a delivery may connect to, checked after DNS resolution.

A partner's URL is data typed by someone else; without a guard it can point the worker at the
database next door, the cloud metadata service, or a name that resolves to ``127.0.0.1``. So the
host is resolved here, every address it resolves to is checked, and the request is then sent to
that checked address itself (see :mod:`sqlqueue.webhooks._http`): no second lookup can answer
differently (DNS rebinding). An address embedding an IPv4 address (IPv4-mapped ``::ffff:a.b.c.d``,
NAT64, 6to4, Teredo) is judged by the address it embeds.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from ipaddress import IPv4Address, IPv6Address

from sqlqueue.webhooks._errors import DeliveryFailed, DeliveryRefused

__all__ = ["Address", "forbidden_because", "resolve"]

Address = IPv4Address | IPv6Address

#: Cloud platform addresses a host reaches only from inside its cloud: the instance metadata
#: services (AWS, GCP, Azure, OpenStack; AWS over IPv6; Alibaba) and Azure's host-only
#: WireServer (``168.63.129.16``: DHCP, DNS, the VM agent), which Python calls global.
_METADATA = frozenset(
    ipaddress.ip_address(text)
    for text in ("169.254.169.254", "fd00:ec2::254", "100.100.100.200", "168.63.129.16")
)
#: Ranges Python's ``is_global`` still calls public that no delivery should reach: IPv6
#: site-local (``fec0::/10``, deprecated by RFC 3879 but still routed inside some sites) and
#: the 6to4 relay anycast (``192.88.99.0/24``, deprecated by RFC 7526: it relays to whatever
#: an attacker's 6to4 address embeds).
_UNROUTED = (
    (ipaddress.ip_network("fec0::/10"), "a site-local address"),
    (ipaddress.ip_network("192.88.99.0/24"), "a 6to4 relay address"),
)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def _embedded_ipv4(address: IPv6Address) -> IPv4Address | None:
    """The IPv4 address an IPv6 address carries by one of the standard embeddings, if any."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in _NAT64:
        return IPv4Address(int(address) & 0xFFFFFFFF)
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    return None


def forbidden_because(address: Address) -> str | None:
    """Why a delivery must not connect to ``address`` (``"a loopback address"`` …), or ``None``
    for a public address."""
    if isinstance(address, IPv6Address):
        embedded = _embedded_ipv4(address)
        if embedded is not None:
            reason = forbidden_because(embedded)
            return f"{reason} ({embedded} inside {address})" if reason else None
    checks = (
        (address in _METADATA, "a cloud metadata address"),
        *((address in network, reason) for network, reason in _UNROUTED),
        (address.is_loopback, "a loopback address"),
        (address.is_unspecified, "the unspecified address"),
        (address.is_link_local, "a link-local address"),
        (address.is_multicast, "a multicast address"),
        (address.is_private, "a private address"),
        (address.is_reserved, "a reserved address"),
        (not address.is_global, "not a public address"),
    )
    for hit, reason in checks:
        if hit:
            return reason
    return None


async def resolve(host: str, port: int, *, allow_private: bool) -> Address:
    """The address to connect to for ``host``: an IP literal as it is, a name through DNS.

    Unless ``allow_private``, every address the name resolves to must be public, or the
    delivery is refused (:class:`DeliveryRefused`, the job goes dead): a name that mixes public
    and private answers is being used to get past the guard. A failed lookup may be transient
    and is retried (:class:`DeliveryFailed`).
    """
    addresses = await _lookup(host, port)
    if not allow_private:
        for address in addresses:
            reason = forbidden_because(address)
            if reason is not None:
                shown = host if host == str(address) else f"{host} resolves to {address}, which"
                raise DeliveryRefused(
                    f"refused to connect: {shown} is {reason}; webhooks only go to public "
                    "addresses (allow_private_addresses=True lifts this, for tests and "
                    "private networks)",
                    details={"host": host, "address": str(address)},
                )
    return addresses[0]


async def _lookup(host: str, port: int) -> list[Address]:
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    try:
        answers = await asyncio.get_running_loop().getaddrinfo(
            host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
        )
    except OSError as error:
        raise DeliveryFailed(
            reason=f"cannot resolve {host}: {error}", details={"host": host, "status": None}
        ) from None
    found: list[Address] = []
    for _family, _type, _proto, _name, sockaddr in answers:
        address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        if address not in found:
            found.append(address)
    if not found:
        raise DeliveryFailed(
            reason=f"cannot resolve {host}: no addresses", details={"host": host, "status": None}
        )
    return found
