"""Host name lookups on threads of their own, one pool a purpose, each lookup bounded in time.

`getaddrinfo` blocks its thread until the name's DNS answers, or until the resolver gives up
(seconds, several times over); a thread that waits cannot be taken back. asyncio's own lookups
run on its default executor, which the upstreams' connections, token counting and file reads
share: names a client chose (image hosts) whose DNS never answers would fill it, and every
upstream named by a hostname would stop connecting. So the image hosts' lookups get a small
pool of their own with a deadline (a stalled name fails the request that named it, and queues
nothing behind it for long), and the upstreams' lookups another, that clients cannot reach.
"""

from __future__ import annotations

import asyncio
import functools
import socket
from concurrent.futures import ThreadPoolExecutor
from typing import Any

AddressInfo = tuple[Any, ...]  # one getaddrinfo() entry: (family, type, proto, canonname, sockaddr)


class HostLookups:
    """Lookups on `threads` threads of their own; each one given up after `seconds`."""

    def __init__(self, name: str, threads: int, seconds: float | None) -> None:
        self.name = name
        self.threads = threads
        self.seconds = seconds
        self._executor: ThreadPoolExecutor | None = None  # made at the first lookup

    @property
    def executor(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self.threads, thread_name_prefix=self.name)
        return self._executor

    async def getaddrinfo(
        self, host: str, port: int | str | None, family: int = 0, flags: int = 0
    ) -> list[AddressInfo]:
        """socket.getaddrinfo's answer (stream sockets); TimeoutError past the deadline, an
        OSError (socket.gaierror) when the name has no address."""
        lookup = functools.partial(socket.getaddrinfo, host, port, family, socket.SOCK_STREAM, 0, flags)
        async with asyncio.timeout(self.seconds):
            # a lookup still queued when its deadline passes never runs (its future is cancelled)
            return await asyncio.get_running_loop().run_in_executor(self.executor, lookup)

    async def getnameinfo(self, address: tuple[Any, ...], flags: int) -> tuple[str, str]:
        async with asyncio.timeout(self.seconds):
            return await asyncio.get_running_loop().run_in_executor(
                self.executor, socket.getnameinfo, address, flags
            )

    async def addresses(self, host: str) -> list[str]:
        """The addresses `host` resolves to."""
        return [str(info[4][0]) for info in await self.getaddrinfo(host, None)]


# image hosts, named by clients: few threads, and a lookup that does not answer soon is refused
IMAGE_HOSTS = HostLookups("chatgate-image-dns", threads=4, seconds=5.0)
# the upstreams' hosts, named by the config: their connect timeout bounds each lookup
UPSTREAM_HOSTS = HostLookups("chatgate-upstream-dns", threads=8, seconds=None)
