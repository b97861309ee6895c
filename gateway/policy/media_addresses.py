"""Which addresses an image may be taken from: public ones, and those in the networks an operator
allows (`media.allowed_private_networks`).

An IPv6 address that carries an IPv4 address inside it reaches that IPv4 address (through the
host's own stack, a NAT64 gateway or a 6to4 relay), so it is judged as that address:
`[::127.0.0.1]`, `[::ffff:127.0.0.1]`, `[64:ff9b::7f00:1]` and `[2002:7f00:1::]` are loopback.
The local-use NAT64 prefix (64:ff9b:1::/48) is never public: its operator decides where the
IPv4 address sits in it, and what it reaches.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# (prefix, how far right of the address's low end the IPv4 address sits, in bits)
IPV4_INSIDE: tuple[tuple[ipaddress.IPv6Network, int], ...] = (
    (ipaddress.IPv6Network("::/96"), 0),  # IPv4-compatible, ::a.b.c.d (deprecated, still routed)
    (ipaddress.IPv6Network("::ffff:0:0/96"), 0),  # IPv4-mapped, ::ffff:a.b.c.d
    (ipaddress.IPv6Network("::ffff:0:0:0/96"), 0),  # IPv4-translated (SIIT), ::ffff:0:a.b.c.d
    (ipaddress.IPv6Network("64:ff9b::/96"), 0),  # NAT64's well-known prefix (RFC 6052)
    (ipaddress.IPv6Network("2002::/16"), 80),  # 6to4: 2002:aabb:ccdd::/48 (RFC 3056)
)
NEVER_PUBLIC = (ipaddress.IPv6Network("64:ff9b:1::/48"),)  # local-use NAT64 (RFC 8215)


def reached(ip: IPAddress) -> IPAddress:
    """The address a packet to `ip` ends up at: the IPv4 address inside it, or itself."""
    if isinstance(ip, ipaddress.IPv6Address):
        for prefix, shift in IPV4_INSIDE:
            if ip in prefix:
                return ipaddress.IPv4Address((int(ip) >> shift) & 0xFFFFFFFF)
    return ip


def is_public(ip: IPAddress) -> bool:
    if any(ip in network for network in NEVER_PUBLIC):
        return False
    target = reached(ip)
    return target.is_global and not target.is_multicast


class AddressScreen:
    def __init__(self, allowed_networks: Iterable[IPNetwork] = ()) -> None:
        self.allowed_networks = tuple(allowed_networks)

    def allows(self, address: str | IPAddress) -> bool:
        """Public, or in an allowed network (as written or as reached)."""
        ip = ipaddress.ip_address(address) if isinstance(address, str) else address
        if is_public(ip):
            return True
        candidates = {ip, reached(ip)}
        return any(candidate in network for network in self.allowed_networks for candidate in candidates)
