"""aiohttp's threaded resolver on threads of the upstreams' own (gateway/core/lookups.py): the
default one uses asyncio's default executor, which lookups of names a client chose could fill."""

from __future__ import annotations

import socket

from aiohttp.abc import AbstractResolver, ResolveResult

from gateway.core.lookups import UPSTREAM_HOSTS, HostLookups

NUMERIC = socket.AI_NUMERICHOST | socket.AI_NUMERICSERV
NAME_NUMERIC = socket.NI_NUMERICHOST | socket.NI_NUMERICSERV
ADDRCONFIG = socket.AI_ADDRCONFIG & getattr(socket, "AI_MASK", -1)


class UpstreamResolver(AbstractResolver):
    def __init__(self, lookups: HostLookups = UPSTREAM_HOSTS) -> None:
        self.lookups = lookups

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        found: list[ResolveResult] = []
        infos = await self.lookups.getaddrinfo(host, port, family, ADDRCONFIG)
        for info_family, _, proto, _, address in infos:
            if info_family == socket.AF_INET6:
                if len(address) < 3:
                    continue  # IPv6 not supported by this Python build or host
                if address[3]:  # a link-local address: its scope is in the name
                    resolved, service = await self.lookups.getnameinfo(address, NAME_NUMERIC)
                    address_host, address_port = resolved, int(service)
                else:
                    address_host, address_port = address[0], address[1]
            else:
                address_host, address_port = address[0], address[1]
            found.append(
                ResolveResult(
                    hostname=host,
                    host=address_host,
                    port=address_port,
                    family=info_family,
                    proto=proto,
                    flags=NUMERIC,
                )
            )
        return found

    async def close(self) -> None:
        return None
