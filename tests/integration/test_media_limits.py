"""How much one request may make the gateway read or fetch for its images (issue 24, item 8: one
956-byte request naming a 20 MB allowed file 10 times took the gateway from 97 to 407 MB; three
3.5 KB requests naming 40 images each, to 3,317 MB). Now a request names at most
`media.max_images_per_request` images to read or fetch, their bytes together are capped by
`media.max_media_bytes_per_request` on the files' sizes before any is read (413 either way,
naming the limit), and a file named twice is read once. In-process with the memory Python
allocates (tracemalloc), then through `chatgate serve` with its resident memory (VmHWM, the
peak, from /proc)."""

from __future__ import annotations

import asyncio
import tracemalloc
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.config.settings import Media
from gateway.core.canonical import ChatRequest
from gateway.core.errors import GatewayError, PayloadTooLarge
from gateway.policy.media import MediaPolicy
from tests.support.gateway_process import GatewayProcess, gateway_process

MB = 1024 * 1024


def request_with(paths: list[str]) -> ChatRequest:
    content: list[dict[str, Any]] = [{"type": "text", "text": "What is it?"}]
    content += [{"type": "image_url", "image_url": {"url": path}} for path in paths]
    return ChatRequest(model="m", messages=[{"role": "user", "content": content}])


def peak_bytes_of(work: Any) -> tuple[int, GatewayError | None]:
    """The most memory Python allocated while `work` (a coroutine) ran, and its refusal if any."""
    tracemalloc.start()
    try:
        asyncio.run(work)
    except GatewayError as error:
        return tracemalloc.get_traced_memory()[1], error
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak, None


@pytest.fixture(scope="module")
def media_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("media")
    (root / "large.png").write_bytes(b"\x89PNG" + b"\x01" * (4 * MB - 4))
    (root / "small.png").write_bytes(b"\x89PNG-small")
    return root


def policy(root: Path, **media: Any) -> MediaPolicy:
    return MediaPolicy(Media(allowed_local_media_path=root, **media))


def test_more_images_than_the_cap_are_refused_naming_it(media_dir: Path):
    paths = [str(media_dir / "small.png")] * 17
    with pytest.raises(PayloadTooLarge) as raised:
        asyncio.run(policy(media_dir).screen(request_with(paths)))
    assert "at most 16" in raised.value.message and "media.max_images_per_request" in raised.value.message
    assert raised.value.code == "TooManyImages"
    asyncio.run(policy(media_dir).screen(request_with(paths[:16])))  # the cap itself is taken


def test_files_over_the_request_s_bytes_are_refused_before_any_is_read(media_dir: Path):
    """A 4 MiB file named 10 times against a 16 MiB cap: refused with next to nothing read."""
    request = request_with([str(media_dir / "large.png")] * 10)
    limited = policy(media_dir, max_media_bytes_per_request=16 * MB, max_local_media_bytes=8 * MB)
    peak, error = peak_bytes_of(limited.screen(request))
    assert isinstance(error, PayloadTooLarge), error
    assert "larger than 16777216 bytes (media.max_media_bytes_per_request)" in error.message
    assert peak < MB, f"{peak / MB:.1f} MiB held while refusing"


def test_a_file_named_again_is_read_once(media_dir: Path):
    """Three times a 4 MiB file: one data: URL, shared by the three parts. Making one data: URL
    holds about 3.7 times the file for a moment (bytes, base64, text); reading the file three
    times, as the old code did, held about 7.8 times it."""
    request = request_with([str(media_dir / "large.png")] * 3)
    peak, error = peak_bytes_of(policy(media_dir).screen(request))
    assert error is None
    urls = [part["image_url"]["url"] for part in request.messages[0]["content"][1:]]
    assert urls[0] is urls[1] is urls[2]
    assert len(urls[0]) > 4 * MB * 4 / 3
    assert peak < 4.5 * 4 * MB, f"{peak / MB:.1f} MiB held for one 4 MiB file"


# ----- through the gateway ------------------------------------------------------------------------

FILE_BYTES = 20 * 1000 * 1000  # the attack's 20 MB file


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GatewayProcess, Path]]:
    root = tmp_path_factory.mktemp("media-20mb")
    (root / "photo.png").write_bytes(b"\x89PNG" + b"\x02" * (FILE_BYTES - 4))
    (root / "small.png").write_bytes(b"\x89PNG-small")
    config = {"media": {"allowed_local_media_path": str(root)}}
    with gateway_process(tmp_path_factory.mktemp("media-limits"), config) as process:
        yield process, root


def memory_mb(process: GatewayProcess, field: str) -> float:
    """VmRSS (now) or VmHWM (the peak so far) of the gateway process, in MB."""
    for line in Path(f"/proc/{process.process.pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no {field} in /proc/{process.process.pid}/status")


def ovms(url: str, images: list[str]) -> httpx.Response:
    content = [{"type": "text", "text": "What is it?"}]
    content += [{"type": "image_url", "image_url": {"url": image}} for image in images]
    body = {"model": "echo", "messages": [{"role": "user", "content": content}]}
    return httpx.post(f"{url}/v3/chat/completions", json=body, timeout=120)


def test_a_20_mb_file_named_10_times_is_refused_without_being_read(gateway: tuple[GatewayProcess, Path]):
    process, root = gateway
    before = memory_mb(process, "VmRSS")
    response = ovms(process.url, [str(root / "photo.png")] * 10)
    assert response.status_code == 413, response.text[:300]
    assert "media.max_media_bytes_per_request" in response.json()["error"]
    growth = memory_mb(process, "VmHWM") - before
    assert growth < 60, f"the gateway's peak memory grew {growth:.0f} MB"


def test_three_requests_of_40_images_are_refused_without_reading_them(gateway: tuple[GatewayProcess, Path]):
    process, root = gateway
    before = memory_mb(process, "VmRSS")
    images = [str(root / "photo.png")] * 40
    with ThreadPoolExecutor(3) as pool:
        responses = list(pool.map(lambda _: ovms(process.url, images), range(3)))
    for response in responses:
        assert response.status_code == 413, response.text[:300]
        assert "media.max_images_per_request" in response.json()["error"]
    growth = memory_mb(process, "VmHWM") - before
    assert growth < 60, f"the gateway's peak memory grew {growth:.0f} MB"


def test_a_nul_in_a_local_path_is_a_400_not_a_500(gateway: tuple[GatewayProcess, Path]):
    """Issue 24, item 13: Path.resolve raised ValueError (embedded null byte), answered 500."""
    process, root = gateway
    for path in (f"{root}/pho\x00to.png", f"{root}/photo.png\x00", f"{root}/\x1bphoto.png"):
        response = ovms(process.url, [path])
        assert response.status_code == 400, (path, response.text)
        assert set(response.json()) == {"error"}
        assert "messages[0].content" in response.json()["error"]
