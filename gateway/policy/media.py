"""Images a request names by URL or path, screened before any backend sees them (OVMS's three
forms: ovms.yaml `ImageUrl`):

- a base64 `data:` URL: passed on;
- an `http://` or `https://` URL, read strictly (gateway/policy/media_url.py) and, as
  `media.remote_images` says, refused (403, the default), fetched by the gateway itself and
  passed on as a `data:` URL (gateway/policy/media_fetch.py), or passed on rebuilt from its
  parts for the backend to fetch. Fetched or forwarded, its host must resolve only to addresses
  that are public or in `media.allowed_private_networks` (gateway/policy/media_addresses.py),
  so that no client reaches loopback, link-local or private ranges through the gateway; else 403.
  Forwarding screens only the first request: redirects and later DNS answers are the backend's;
- an absolute path on the gateway's filesystem: only under `media.allowed_local_media_path`
  (symlinks resolved), read by the gateway and passed on as a base64 `data:` URL, which every
  backend, local or remote, can read; a path the server does not allow is a 403, no file there
  a 404.

Anything else (junk, a relative path, one with `..` or a control character, an http(s) URL with
no host, user information or a backslash) is a 400 that says which of the three forms the image
must take; ovms.yaml's pattern for the URL says the same, so the front door usually answers it
first. The statuses tell a request the document refuses (400) from one it admits and this
server's configuration or network refuses (403, 404): whatever the pattern admits is never a
400 here (a host the URL parser cannot read is one that resolves to nothing, 403), which
`test_media.py` checks with strings drawn from the pattern. Past the per-image checks, a request
may name at most `media.max_images_per_request` images to read, fetch or forward, and the bytes
read and fetched are capped per image and per request (413), checked on the files' sizes before
any is read; a file named twice is read once. An image that cannot be fetched is a 422.
"""

from __future__ import annotations

import asyncio
import base64
import mimetypes
import stat
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from gateway.config.settings import Media
from gateway.core.canonical import ChatRequest
from gateway.core.errors import (
    BadRequest,
    Forbidden,
    GatewayError,
    NotFound,
    PayloadTooLarge,
    ServiceUnavailable,
    UnprocessableContent,
)
from gateway.core.lookups import IMAGE_HOSTS
from gateway.policy.media_addresses import AddressScreen
from gateway.policy.media_url import (
    CONTROL,
    FetchFailed,
    ImageURL,
    Malformed,
    TooLarge,
    Unreadable,
    parse_image_url,
)

if TYPE_CHECKING:
    from gateway.policy.media_fetch import ImageFetcher

# host → the addresses it resolves to (raises OSError when it resolves to none)
Resolver = Callable[[str], Awaitable[list[str]]]
Loc = list[str | int]
FETCHES_AT_ONCE = 4  # a request's remote images fetched at once
FORMS = "a base64 data: URL, an http(s) URL, or a path under the server's allowed local media directory"
CODES: dict[type[GatewayError], str] = {
    BadRequest: "InvalidImage",
    Forbidden: "ImageNotAllowed",
    NotFound: "ImageNotFound",
    PayloadTooLarge: "ImageTooLarge",
    UnprocessableContent: "ImageNotFetched",
}


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


@dataclass
class LocalImage:
    at: tuple[int, int]
    loc: Loc
    named: str
    real: Path
    size: int


@dataclass
class RemoteImage:
    at: tuple[int, int]
    loc: Loc
    url: ImageURL


class MediaBudget:
    """What is left of the request's bytes of local and fetched images."""

    def __init__(self, total: int) -> None:
        self.total = self.left = total

    def take(self, size: int, loc: Loc, value: str) -> None:
        if size > self.left:
            raise self.exceeded(loc, value)
        self.left -= size

    def exceeded(self, loc: Loc, value: str) -> GatewayError:
        message = (
            f"The request's images together are larger than {self.total} bytes "
            "(media.max_media_bytes_per_request)."
        )
        return refused(message, loc, value, PayloadTooLarge)


class MediaInFlight:
    """The bytes of images this worker holds now (read or fetched, until each request's answer
    ends), across its requests: at most `most`."""

    def __init__(self, most: int) -> None:
        self.most = most
        self.held = 0


class HeldMedia:
    """What one request holds of the worker's bytes in flight; given back when its answer ends."""

    def __init__(self, in_flight: MediaInFlight) -> None:
        self.in_flight = in_flight
        self.size = 0

    def take(self, size: int) -> None:
        in_flight = self.in_flight
        if in_flight.held + size > in_flight.most:
            raise ServiceUnavailable(
                "The gateway holds as many images as it may at once (media.max_media_bytes_in_flight); "
                "try again later.",
                code="MediaBusy",
                headers={"Retry-After": "1"},
            )
        in_flight.held += size
        self.size += size

    def release(self) -> None:
        self.in_flight.held -= self.size
        self.size = 0


class MediaPolicy:
    def __init__(self, settings: Media, resolve: Resolver = IMAGE_HOSTS.addresses) -> None:
        self.root = settings.allowed_local_media_path
        self.max_local_bytes = settings.max_local_media_bytes
        self.remote_images = settings.remote_images
        self.addresses = AddressScreen(settings.allowed_private_networks)
        self.max_images = settings.max_images_per_request
        self.max_request_bytes = settings.max_media_bytes_per_request
        self.max_fetched_bytes = settings.fetch.max_bytes
        self.fetch_timeout = settings.fetch.timeout
        self.in_flight = MediaInFlight(settings.max_media_bytes_in_flight)
        self.fetcher: ImageFetcher | None = None
        if self.remote_images == "fetch":  # aiohttp is loaded only where images are fetched (12 MB)
            from gateway.policy.media_fetch import ImageFetcher

            self.fetcher = ImageFetcher(settings.fetch)
        self.resolve = resolve

    @property
    def holds_images(self) -> bool:
        """Whether a request's images may hold the worker's memory: local files read, or remote
        images fetched (a data: URL the client sent is the request's own)."""
        return self.root is not None or self.fetcher is not None

    def names_images(self, request: ChatRequest) -> bool:
        return any(True for _ in image_urls(request.messages))

    async def screen(self, request: ChatRequest) -> HeldMedia:
        """Refuse an image in none of the three forms or from where this server takes none;
        read a local one, or fetch a remote one, into a data: URL. What the request holds of
        the worker's bytes in flight is given back by the caller when its answer ends."""
        held = HeldMedia(self.in_flight)
        try:
            await self.screened(request, held)
        except BaseException:
            held.release()
            raise
        return held

    async def screened(self, request: ChatRequest, held: HeldMedia) -> None:
        local: list[LocalImage] = []
        remote: list[RemoteImage] = []
        resolved: dict[str, list[str]] = {}  # a host named twice is looked up once
        for m, p, image_url in image_urls(request.messages):
            url = image_url.get("url")
            loc: Loc = ["body", "messages", m, "content", p, "image_url", "url"]
            if not isinstance(url, str):
                continue  # the document's business
            if url.startswith("data:"):
                if ";base64," not in url.partition(",")[0] + ",":
                    raise refused(f"A data: URL image must be base64 ({FORMS}).", loc)
            elif url.lower().startswith(("http://", "https://")):
                parsed = self.remote_url(url, loc)
                await self.addresses_of(parsed, loc, resolved)
                remote.append(RemoteImage((m, p), loc, parsed))
            else:
                local.append(await self.local_file((m, p), url, loc))
        if len(local) + len(remote) > self.max_images:
            raise refused(
                f"The request names {len(local) + len(remote)} images to read or fetch; this server "
                f"takes at most {self.max_images} a request (media.max_images_per_request).",
                ["body", "messages"],
                kind=PayloadTooLarge,
            )
        budget = MediaBudget(self.max_request_bytes)
        replaced = await self.read_all(local, budget, held)
        if self.remote_images == "forward":
            replaced.update((image.at, image.url.text) for image in remote)
        elif remote:
            fetched = await self.fetch_all(remote, budget, resolved, held)
            for image in remote:
                replaced[image.at], size = fetched[image.url.text]
                budget.take(size, image.loc, image.url.text)
        if replaced:
            request.messages = with_urls(request.messages, replaced)

    async def fetch_all(
        self, images: list[RemoteImage], budget: MediaBudget, resolved: dict[str, list[str]], held: HeldMedia
    ) -> dict[str, tuple[str, int]]:
        """Each URL's image as a data: URL and its size, once however often it is named: fetched
        FETCHES_AT_ONCE at a time, all within one `fetch.timeout`."""
        first: dict[str, RemoteImage] = {}
        for image in images:
            first.setdefault(image.url.text, image)
        gate = asyncio.Semaphore(FETCHES_AT_ONCE)
        deadline = asyncio.get_running_loop().time() + self.fetch_timeout

        async def one(image: RemoteImage) -> tuple[str, int]:
            async with gate:
                return await self.fetch(image, budget, resolved, held, deadline)

        tasks = [asyncio.ensure_future(one(image)) for image in first.values()]
        try:
            found = await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        return dict(zip(first, found, strict=True))

    # ----- http(s) URLs -------------------------------------------------------------------------

    def remote_url(self, url: str, loc: Loc) -> ImageURL:
        try:
            parsed = parse_image_url(url)
        except Malformed as error:
            raise refused(f"{error} ({FORMS})", loc, url) from None
        except Unreadable as error:  # as for a host that resolves to nothing
            raise refused(
                f"{error} It cannot be resolved, so it cannot be checked: images are taken only "
                "from public addresses.",
                loc,
                url,
                Forbidden,
            ) from None
        if self.remote_images == "refuse":
            raise refused(
                "This server takes no images by URL (media.remote_images: refuse): send the image "
                "as a base64 data: URL.",
                loc,
                url,
                Forbidden,
            )
        return parsed

    async def addresses_of(
        self, url: ImageURL, loc: Loc, resolved: dict[str, list[str]], redirected_from: str | None = None
    ) -> list[str]:
        """The addresses the URL's host may be reached at; 403 unless each is allowed."""
        seen = url.text if redirected_from is None else redirected_from
        why = "" if redirected_from is None else f" (a redirect to {url.text})"
        if url.address is not None:
            addresses = [str(url.address)]
        elif url.host in resolved:
            addresses = resolved[url.host]
        else:
            try:
                addresses = resolved[url.host] = await self.resolve(url.host)
            except (OSError, UnicodeError, ValueError):  # no such name, or not a name at all (idna)
                addresses = []
        if not addresses:
            raise refused(
                f"The image URL's host '{url.host}'{why} cannot be resolved, so it cannot be checked: "
                "images are taken only from public addresses.",
                loc,
                seen,
                Forbidden,
            )
        if not all(self.addresses.allows(address) for address in addresses):
            raise refused(
                f"The image URL's host '{url.host}'{why} is a loopback, link-local or private "
                "address: images are taken only from public addresses.",
                loc,
                seen,
                Forbidden,
            )
        return addresses

    async def fetch(
        self,
        image: RemoteImage,
        budget: MediaBudget,
        resolved: dict[str, list[str]],
        held: HeldMedia,
        deadline: float,
    ) -> tuple[str, int]:
        """The image as a data: URL, and its size (taken from the budget by the caller)."""
        limit = min(self.max_fetched_bytes, budget.left)
        sent = image.url.text

        async def screen(url: ImageURL) -> list[str]:
            return await self.addresses_of(url, image.loc, resolved, None if url == image.url else sent)

        assert self.fetcher is not None
        try:
            media_type, data = await self.fetcher.fetch(image.url, screen, limit, held.take, deadline)
        except TooLarge:
            if limit < self.max_fetched_bytes:
                raise budget.exceeded(image.loc, sent) from None
            message = f"The image is larger than {limit} bytes (media.fetch.max_bytes)."
            raise refused(message, image.loc, sent, PayloadTooLarge) from None
        except FetchFailed as error:
            message = f"The image at this URL could not be fetched: {error}."
            raise refused(message, image.loc, sent, UnprocessableContent) from None
        return data_url(media_type, data), len(data)

    # ----- local paths --------------------------------------------------------------------------

    async def local_file(self, at: tuple[int, int], path: str, loc: Loc) -> LocalImage:
        named = PurePosixPath(path)
        if not named.is_absolute():
            raise refused(f"The image is not one of {FORMS}.", loc, path)
        if ".." in named.parts:
            raise refused("A local image path may not contain '..'.", loc, path)
        if CONTROL.search(path):
            raise refused("A local image path may not contain a control character.", loc, path)
        if self.root is None:
            raise refused("Local image paths are not allowed on this server.", loc, path, Forbidden)
        real, size = await asyncio.to_thread(self.find_under_root, Path(path), loc)
        if size > self.max_local_bytes:
            raise refused(
                f"The image file is larger than {self.max_local_bytes} bytes (media.max_local_media_bytes).",
                loc,
                path,
                PayloadTooLarge,
            )
        return LocalImage(at, loc, path, real, size)

    def find_under_root(self, path: Path, loc: Loc) -> tuple[Path, int]:
        """The file's real path and size, when it lies under the root once symlinks are resolved."""
        assert self.root is not None
        try:
            real = path.resolve(strict=True)
        except OSError:
            raise refused("No image file at this path.", loc, str(path), NotFound) from None
        if not real.is_relative_to(self.root):
            raise refused(
                "The image path leads outside the allowed local media directory.", loc, str(path), Forbidden
            )
        try:
            status = real.stat()
        except OSError:
            status = None
        if status is None or not stat.S_ISREG(status.st_mode):  # gone, a directory, a device, a pipe
            raise refused("No image file at this path.", loc, str(path), NotFound)
        return real, status.st_size

    async def read_all(
        self, images: list[LocalImage], budget: MediaBudget, held: HeldMedia
    ) -> dict[tuple[int, int], str]:
        """Each file as a data: URL, once however often it is named; the sizes first, so that
        a request over the cap is refused before anything is read."""
        for image in images:
            budget.take(image.size, image.loc, image.named)
        held.take(sum(image.size for image in images))
        read: dict[Path, str] = {}
        for image in images:
            if image.real not in read:
                read[image.real] = await asyncio.to_thread(self.read_file, image)
        return {image.at: read[image.real] for image in images}

    def read_file(self, image: LocalImage) -> str:
        try:
            with image.real.open("rb") as handle:
                data = handle.read(image.size + 1)
        except OSError:  # unreadable
            raise refused("No image file at this path.", image.loc, image.named, NotFound) from None
        if len(data) > image.size:  # it grew since its size was taken
            raise refused("The image file changed while it was read.", image.loc, image.named, NotFound)
        media_type = mimetypes.guess_type(image.real.name)[0] or "application/octet-stream"
        return data_url(media_type, data)


def data_url(media_type: str, data: bytes) -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


def field_name(loc: Loc) -> str:
    """["body", "messages", 0, "content", 1, …] → "messages[0].content[1]…"."""
    name = ""
    for part in loc[1:]:
        name += f"[{part}]" if isinstance(part, int) else f".{part}" if name else part
    return name


def refused(message: str, loc: Loc, value: Any = None, kind: type[GatewayError] = BadRequest) -> GatewayError:
    """The refusal, its message naming the field (OVMS's error body is the message alone)."""
    code = "TooManyImages" if loc == ["body", "messages"] else CODES[kind]
    return kind(f"{field_name(loc)}: {message}", param="messages", loc=loc, value=value, code=code)


def with_urls(messages: list[dict[str, Any]], urls: dict[tuple[int, int], str]) -> list[dict[str, Any]]:
    """The messages with the image parts at `urls` pointing at new URLs (the body is left as it was)."""
    copied = list(messages)
    for (m, p), url in urls.items():
        message = copied[m] = dict(copied[m])
        content = message["content"] = list(message["content"])
        part = content[p] = dict(content[p])
        part["image_url"] = {**part["image_url"], "url": url}
    return copied
