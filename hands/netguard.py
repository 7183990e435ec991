"""SSRF guard: which addresses a network tool may reach, checked after DNS and pinned.

A URL's host is resolved once; every address it resolves to must be public
(no loopback, private, link-local, CGNAT, multicast, reserved or metadata
address, IPv4-mapped or not). The request then goes to the checked address,
so a second DNS answer (rebinding) cannot redirect it. Redirects are checked
the same way, one hop at a time.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

from bus.protocol import ErrorCode
from hands.errors import ToolFailure

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
METADATA_HOSTS = frozenset({"metadata.google.internal", "metadata", "instance-data"})


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str  # as written (for the Host header, SNI and certificate checks)
    port: int
    address: str  # the checked address the connection is pinned to


# IPv6 ranges that carry an IPv4 address in their last 32 bits: the IPv4 address decides.
V4_IN_LOW_BITS = tuple(ipaddress.IPv6Network(n) for n in (
    "::ffff:0:0/96",    # IPv4-mapped
    "::ffff:0:0:0/96",  # IPv4-translated (SIIT)
    "::/96",            # IPv4-compatible (deprecated), :: and ::1 included: both are never public
    "64:ff9b::/96",     # NAT64, well-known prefix: a NAT64 gateway connects to the IPv4 address
))
# IPv6 ranges never reached, whatever ``is_global`` says of them.
NEVER_PUBLIC_V6 = tuple(ipaddress.IPv6Network(n) for n in (
    "64:ff9b:1::/48",   # NAT64, local-use prefix: the IPv4 address sits where the operator chose
    "fec0::/10",        # site-local (deprecated, still routed inside some networks)
))


def embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one stands for (mapped, translated, compatible, NAT64, 6to4, Teredo)."""
    if any(address in network for network in V4_IN_LOW_BITS):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]  # the client behind the relay
    return None


def public(address: IPAddress, *, also_allowed: list[ipaddress.IPv4Network | ipaddress.IPv6Network]) -> bool:
    """Whether a network tool may connect to ``address``: the one decision, every range in the two tables."""
    if any(address in network for network in also_allowed):
        return True
    if isinstance(address, ipaddress.IPv6Address):
        inner = embedded_ipv4(address)
        if inner is not None:
            return public(inner, also_allowed=also_allowed)
        if any(address in network for network in NEVER_PUBLIC_V6):
            return False
    return address.is_global and not address.is_multicast


async def resolve(url: str, *, also_allowed: list[ipaddress.IPv4Network | ipaddress.IPv6Network]) -> Target:
    """The pinned target of ``url``, or ``PERMISSION_DENIED`` / ``INVALID_ARGUMENTS`` / ``NETWORK_ERROR``."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ToolFailure(ErrorCode.INVALID_ARGUMENTS, f"only http and https URLs can be fetched, not {parts.scheme!r}")
    host = (parts.hostname or "").rstrip(".").lower()
    if not host:
        raise ToolFailure(ErrorCode.INVALID_ARGUMENTS, f"{url!r} has no host")
    if host in METADATA_HOSTS or host.endswith((".internal", ".local", ".localhost")) or host == "localhost":
        raise _blocked(url, host)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise ToolFailure(ErrorCode.INVALID_ARGUMENTS, f"{url!r} has an invalid port") from None
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ToolFailure(ErrorCode.NETWORK_ERROR, f"cannot resolve {host!r}: {exc.strerror}") from None
    addresses = [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]
    if not addresses or not all(public(a, also_allowed=also_allowed) for a in addresses):
        raise _blocked(url, host, [str(a) for a in addresses])
    return Target(scheme=parts.scheme, host=host, port=port, address=str(addresses[0]))


def _blocked(url: str, host: str, addresses: list[str] | None = None) -> ToolFailure:
    resolved = f" (resolves to {', '.join(addresses)})" if addresses else ""
    return ToolFailure(
        ErrorCode.PERMISSION_DENIED,
        f"{url!r} points at {host}{resolved}, a local, private or metadata address; network tools only reach "
        "public addresses",
        suggestions=["fetch a public URL", "an operator can allow a network with hands.web.allow_networks"],
    )
