"""Fetching a remote image the way it was screened (`media.remote_images: fetch`).

The connection goes to an address the screen let through and to no other: aiohttp asks
`PinnedResolver`, which answers only with the addresses screened for that host and never asks
DNS again (so a name that resolves to a public address when screened and to a private one when
fetched, DNS rebinding, gets nowhere). Redirects are followed by hand, each target screened like
the first URL, at most `max_redirects` of them. The whole fetch has one deadline, the body a size
cap, and the answer must say it is an image, sent as it is (no content encoding).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from urllib.parse import urljoin

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult

from gateway.config.settings import MediaFetch
from gateway.policy.media_url import FetchFailed, ImageURL, Malformed, TooLarge, Unreadable, parse_image_url

# screens a URL's host: the addresses it may be fetched from (raises the refusal otherwise)
Screen = Callable[[ImageURL], Awaitable[list[str]]]
REDIRECTS = {301, 302, 303, 307, 308}
CHUNK_BYTES = 64 * 1024


class PinnedResolver(AbstractResolver):
    """aiohttp's resolver, answering only with addresses already screened."""

    def __init__(self) -> None:
        self.pinned: dict[str, list[str]] = {}

    def pin(self, host: str, addresses: list[str]) -> None:
        self.pinned[host.removesuffix(".")] = addresses

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        addresses = self.pinned.get(host.lower().removesuffix("."))
        if not addresses:
            raise OSError(f"{host} was not screened")
        return [
            ResolveResult(
                hostname=host,
                host=address,
                port=port,
                family=socket.AF_INET6 if ":" in address else socket.AF_INET,
                proto=0,
                flags=socket.AI_NUMERICHOST,
            )
            for address in addresses
        ]

    async def close(self) -> None:
        pass


class ImageFetcher:
    def __init__(self, settings: MediaFetch) -> None:
        self.timeout = settings.timeout
        self.max_redirects = settings.max_redirects

    async def fetch(
        self, url: ImageURL, screen: Screen, limit: int, hold: Callable[[int], None], deadline: float
    ) -> tuple[str, bytes]:
        """(media type, bytes) of the image at `url`; at most `limit` bytes, else TooLarge.
        `hold` is told of each piece read as it arrives (it raises to stop the read); by
        `deadline` (the loop's clock: the request's images share one `fetch.timeout`)."""
        resolver = PinnedResolver()
        connector = aiohttp.TCPConnector(resolver=resolver, use_dns_cache=False, force_close=True)
        session = aiohttp.ClientSession(connector=connector, auto_decompress=False, trust_env=False)
        try:
            async with session, asyncio.timeout_at(deadline):
                return await self.follow(session, resolver, url, screen, limit, hold)
        except TimeoutError:
            raise FetchFailed(
                f"no answer within {self.timeout:g} s, the time for a request's images (media.fetch.timeout)"
            ) from None
        except aiohttp.ClientError as error:
            raise FetchFailed(f"the connection failed ({type(error).__name__})") from None

    async def follow(
        self,
        session: aiohttp.ClientSession,
        resolver: PinnedResolver,
        url: ImageURL,
        screen: Screen,
        limit: int,
        hold: Callable[[int], None],
    ) -> tuple[str, bytes]:
        for _hop in range(self.max_redirects + 1):
            if url.address is None:
                resolver.pin(url.host, await screen(url))
            else:
                await screen(url)
            headers = {"Accept": "image/*", "Accept-Encoding": "identity"}
            async with session.get(url.text, headers=headers, allow_redirects=False) as response:
                if response.status in REDIRECTS and "Location" in response.headers:
                    url = redirect_target(url, response.headers["Location"])
                    continue
                if response.status != 200:
                    raise FetchFailed(f"its server answered {response.status}")
                return await image_of(response, limit, hold)
        raise FetchFailed(f"more than {self.max_redirects} redirects (media.fetch.max_redirects)")


def redirect_target(url: ImageURL, location: str) -> ImageURL:
    try:
        return parse_image_url(urljoin(url.text, location))
    except (Malformed, Unreadable) as error:
        raise FetchFailed(f"it redirects to a URL the gateway does not follow: {error}") from None


async def image_of(
    response: aiohttp.ClientResponse, limit: int, hold: Callable[[int], None]
) -> tuple[str, bytes]:
    media_type = response.content_type
    if not media_type.startswith("image/"):
        raise FetchFailed(f"it is not an image (Content-Type: {media_type})")
    encoding = response.headers.get("Content-Encoding", "identity").lower()
    if encoding != "identity":
        raise FetchFailed(f"it was sent encoded (Content-Encoding: {encoding})")
    if response.content_length is not None and response.content_length > limit:
        raise TooLarge()
    data = bytearray()
    async for chunk in response.content.iter_chunked(CHUNK_BYTES):
        hold(len(chunk))
        data += chunk
        if len(data) > limit:
            raise TooLarge()
    return media_type, bytes(data)
