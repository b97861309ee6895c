"""Images a request names by URL or path, screened before any backend sees them (OVMS's three
forms: ovms.yaml `ImageUrl`):

- a base64 `data:` URL: passed on;
- an `http://` or `https://` URL: passed on only when every address its host resolves to is a
  public one, so that no backend is made to fetch from loopback, link-local or private ranges
  on a client's behalf (the gateway itself never fetches it); else 403;
- an absolute path on the gateway's filesystem: only under `media.allowed_local_media_path`
  (symlinks resolved), read by the gateway and passed on as a base64 `data:` URL, which every
  backend, local or remote, can read; a path the server does not allow is a 403, no file there
  a 404.

Anything else (junk, a relative path, one with `..`, an http(s) URL with no host) is a 400
that says which of the three forms the image must take; ovms.yaml's pattern for the URL says
the same, so the front door usually answers it first. The statuses tell a request the document
refuses (400) from one it admits and this server's configuration or network refuses (403, 404):
whatever the pattern admits is never a 400 here (a host the URL parser cannot read is one that
resolves to nothing, 403), which `test_media.py` checks with strings drawn from the pattern.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import mimetypes
import socket
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

from gateway.config import Media
from gateway.core.canonical import ChatRequest
from gateway.core.errors import BadRequest, Forbidden, GatewayError, NotFound

# host → the addresses it resolves to (raises OSError when it resolves to none)
Resolver = Callable[[str], Awaitable[list[str]]]
FORMS = "a base64 data: URL, an http(s) URL, or a path under the server's allowed local media directory"


async def system_resolver(host: str) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


def is_public(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])  # an IPv6 zone (fe80::1%eth0) is link-local
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


def image_urls(messages: list[dict[str, Any]]) -> Iterator[tuple[int, int, dict[str, Any]]]:
    """(message index, part index, the part's `image_url` object) of every image part."""
    for m, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        for p, part in enumerate(content if isinstance(content, list) else ()):
            if (
                isinstance(part, dict)
                and part.get("type") == "image_url"
                and isinstance(part.get("image_url"), dict)
            ):
                yield m, p, part["image_url"]


class MediaPolicy:
    def __init__(self, settings: Media, resolve: Resolver = system_resolver) -> None:
        self.root = settings.allowed_local_media_path
        self.max_bytes = settings.max_local_media_bytes
        self.resolve = resolve

    async def screen(self, request: ChatRequest) -> None:
        """Refuse an image in none of the three forms; read a local one into a data: URL."""
        replaced: dict[tuple[int, int], str] = {}
        for m, p, image in image_urls(request.messages):
            url = image.get("url")
            loc: list[str | int] = ["body", "messages", m, "content", p, "image_url", "url"]
            if not isinstance(url, str):
                continue  # the document's business
            if url.startswith("data:"):
                if ";base64," not in url.partition(",")[0] + ",":
                    raise refused(f"A data: URL image must be base64 ({FORMS}).", loc)
            elif url.lower().startswith(("http://", "https://")):
                await self.check_url(url, loc)
            else:
                replaced[(m, p)] = await self.read_local(url, loc)
        if replaced:
            request.messages = with_urls(request.messages, replaced)

    async def check_url(self, url: str, loc: list[str | int]) -> None:
        try:
            host = urlsplit(url).hostname
        except ValueError:  # a bracketed host that is no address, or one NFKC turns into delimiters
            host = url.split("//", 1)[1].partition("/")[0]  # named in the refusal: it resolves to nothing
            addresses = []
        else:
            if not host:  # ovms.yaml's pattern asks for one, so the front door usually says so first
                raise refused("The image URL has no host.", loc, url)
            try:
                addresses = [host] if is_address(host) else await self.resolve(host)
            except (OSError, UnicodeError, ValueError):  # no such name, or not a name at all (idna)
                addresses = []
        if not addresses:
            raise refused(
                f"The image URL's host '{host}' cannot be resolved, so it cannot be checked: images "
                "are taken only from public addresses.",
                loc,
                url,
                Forbidden,
            )
        if not all(is_public(address) for address in addresses):
            raise refused(
                f"The image URL's host '{host}' is a loopback, link-local or private address: "
                "images are taken only from public addresses.",
                loc,
                url,
                Forbidden,
            )

    async def read_local(self, path: str, loc: list[str | int]) -> str:
        named = PurePosixPath(path)
        if not named.is_absolute():
            raise refused(f"The image is not one of {FORMS}.", loc, path)
        if ".." in named.parts:
            raise refused("A local image path may not contain '..'.", loc, path)
        if self.root is None:
            raise refused("Local image paths are not allowed on this server.", loc, path, Forbidden)
        return await asyncio.to_thread(self.read_under_root, Path(path), loc)

    def read_under_root(self, path: Path, loc: list[str | int]) -> str:
        """The file as a data: URL, when it lies under the root once symlinks are resolved."""
        assert self.root is not None
        try:
            real = path.resolve(strict=True)
        except OSError:
            raise refused("No image file at this path.", loc, str(path), NotFound) from None
        if not real.is_relative_to(self.root):
            raise refused(
                "The image path leads outside the allowed local media directory.", loc, str(path), Forbidden
            )
        if not real.is_file():  # a directory, a device, a pipe
            raise refused("No image file at this path.", loc, str(path), NotFound)
        try:
            with real.open("rb") as handle:
                data = handle.read(self.max_bytes + 1)
        except OSError:  # unreadable
            raise refused("No image file at this path.", loc, str(path), NotFound) from None
        if len(data) > self.max_bytes:
            raise refused(f"The image file is larger than {self.max_bytes} bytes.", loc, str(path))
        media_type = mimetypes.guess_type(real.name)[0] or "application/octet-stream"
        return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


def is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    return True


def refused(
    message: str, loc: list[str | int], value: Any = None, kind: type[GatewayError] = BadRequest
) -> GatewayError:
    codes = {BadRequest: "InvalidImage", Forbidden: "ImageNotAllowed", NotFound: "ImageNotFound"}
    return kind(message, param="messages", loc=loc, value=value, code=codes[kind])


def with_urls(messages: list[dict[str, Any]], urls: dict[tuple[int, int], str]) -> list[dict[str, Any]]:
    """The messages with the image parts at `urls` pointing at new URLs (the body is left as it was)."""
    copied = list(messages)
    for (m, p), url in urls.items():
        message = copied[m] = dict(copied[m])
        content = message["content"] = list(message["content"])
        part = content[p] = dict(content[p])
        part["image_url"] = {**part["image_url"], "url": url}
    return copied
