"""OVMS's images (gateway/policy/media.py), with real files, symlinks and resolved names: base64
data URLs pass, http(s) URLs pass only toward public addresses, local paths are read only under
the allowed directory (symlinks resolved, no `..`) and passed on as data URLs; anything else is a
400 in the dialect's shape, before any backend. Then the same through a running gateway."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gateway.config import Media
from gateway.core.canonical import ChatRequest
from gateway.core.errors import BadRequest
from gateway.policy.media import MediaPolicy
from tests.servers import running_gateway

PNG = b"\x89PNG\r\n\x1a\n-a-small-image"
NAMES = {
    "images.example.com": ["93.184.216.34"],
    "dual.example.com": ["93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946"],
    "rebind.example.com": ["93.184.216.34", "10.0.0.7"],  # one private address is enough to refuse
    "localhost": ["127.0.0.1", "::1"],
    "metadata.internal": ["169.254.169.254"],
}


async def fake_resolver(host: str) -> list[str]:
    if host not in NAMES:
        raise OSError(f"unknown host {host}")
    return NAMES[host]


@pytest.fixture
def media_dir(tmp_path: Path) -> Path:
    root = tmp_path / "media"
    (root / "animals").mkdir(parents=True)
    (root / "animals" / "zebra.png").write_bytes(PNG)
    (root / "big.png").write_bytes(b"x" * 2048)
    outside = tmp_path / "secret.txt"
    outside.write_text("not an image")
    (root / "link-out").symlink_to(outside)  # points outside: refused
    (root / "link-in").symlink_to(root / "animals" / "zebra.png")  # stays inside: read
    (tmp_path / "elsewhere").symlink_to(root / "animals")  # a way in from outside: read as inside
    return root


def policy(root: Path | None, max_bytes: int = 1024) -> MediaPolicy:
    return MediaPolicy(Media(allowed_local_media_path=root, max_local_media_bytes=max_bytes), fake_resolver)


def request_with(url: str) -> ChatRequest:
    content = [{"type": "text", "text": "What is it?"}, {"type": "image_url", "image_url": {"url": url}}]
    return ChatRequest(model="m", messages=[{"role": "user", "content": content}])


def screened(policy: MediaPolicy, url: str) -> str:
    request = request_with(url)
    asyncio.run(policy.screen(request))
    return request.messages[0]["content"][1]["image_url"]["url"]


def refusal(policy: MediaPolicy, url: str) -> BadRequest:
    with pytest.raises(BadRequest) as raised:
        asyncio.run(policy.screen(request_with(url)))
    error = raised.value
    assert error.loc == ["body", "messages", 0, "content", 1, "image_url", "url"]
    return error


PASSED_ON = [
    "data:image/png;base64,iVBORw0KGgo=",
    "https://images.example.com/zebra.jpeg",
    "http://dual.example.com:8080/zebra.jpeg",
    "https://93.184.216.34/zebra.jpeg",
    "https://[2606:2800:220:1:248:1893:25c8:1946]/zebra.jpeg",
]


@pytest.mark.parametrize("url", PASSED_ON)
def test_base64_and_public_urls_are_passed_on_as_sent(media_dir: Path, url: str):
    assert screened(policy(media_dir), url) == url


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://localhost/zebra.png", "private"),
        ("http://127.0.0.1:8080/zebra.png", "private"),
        ("http://[::1]/zebra.png", "private"),
        ("http://[::ffff:127.0.0.1]/zebra.png", "private"),
        ("http://169.254.169.254/latest/meta-data/", "private"),
        ("http://metadata.internal/latest", "private"),
        ("http://10.1.2.3/zebra.png", "private"),
        ("http://192.168.0.10/zebra.png", "private"),
        ("http://172.16.5.4/zebra.png", "private"),
        ("http://[fd00::1]/zebra.png", "private"),
        ("http://[fe80::1%25eth0]/zebra.png", "private"),
        ("http://0.0.0.0/zebra.png", "private"),
        ("http://rebind.example.com/zebra.png", "private"),
        ("http://no-such-host.example/zebra.png", "cannot be resolved"),
        ("https:///zebra.png", "no host"),
        ("data:image/png,not-base64", "base64"),
    ],
)
def test_urls_toward_private_ranges_and_junk_are_refused(media_dir: Path, url: str, why: str):
    assert why in refusal(policy(media_dir), url).message


def test_a_local_path_under_the_directory_is_read_into_a_data_url(media_dir: Path):
    expected = "data:image/png;base64," + base64.b64encode(PNG).decode()
    assert screened(policy(media_dir), str(media_dir / "animals" / "zebra.png")) == expected
    assert screened(policy(media_dir), str(media_dir / "link-in")) == expected  # a symlink that stays in
    assert screened(policy(media_dir), str(media_dir.parent / "elsewhere" / "zebra.png")) == expected


@pytest.mark.parametrize(
    "relative",
    [
        "../secret.txt",  # `..` is refused whatever it resolves to
        "animals/../animals/zebra.png",
        "link-out",  # a symlink leading out
        "animals",  # a directory
        "nothing-here.png",
        "big.png",  # above max_local_media_bytes
    ],
)
def test_local_paths_that_leave_the_directory_or_are_no_file_are_refused(media_dir: Path, relative: str):
    refusal(policy(media_dir), f"{media_dir}/{relative}")


@pytest.mark.parametrize(
    "url", ["/etc/passwd", "../../etc/passwd", "zebra.png", "file:///etc/passwd", "junk"]
)
def test_outside_paths_relative_paths_and_junk_are_refused(media_dir: Path, url: str):
    refusal(policy(media_dir), url)


def test_without_a_directory_no_local_path_is_read(media_dir: Path):
    error = refusal(policy(None), str(media_dir / "animals" / "zebra.png"))
    assert "not allowed on this server" in error.message


def test_the_body_is_left_as_it_was(media_dir: Path):
    request = request_with(str(media_dir / "animals" / "zebra.png"))
    original = request.messages
    before = str(original)
    asyncio.run(policy(media_dir).screen(request))
    assert str(original) == before and request.messages is not original


def test_the_directory_must_exist_and_be_absolute(tmp_path: Path):
    with pytest.raises(ValueError, match="not a directory"):
        Media(allowed_local_media_path=tmp_path / "missing")
    with pytest.raises(ValueError, match="not an absolute path"):
        Media(allowed_local_media_path=Path("relative/dir"))


# ----- through the gateway ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, log_dir: Path) -> Iterator[tuple[str, Path]]:
    root = tmp_path_factory.mktemp("media")
    (root / "zebra.png").write_bytes(PNG)
    config = tmp_path_factory.mktemp("media-config") / "config.yaml"
    config.write_text(yaml.safe_dump({"media": {"allowed_local_media_path": str(root)}}))
    with running_gateway(log_dir, config) as url:
        yield url, root


def ovms(url: str, image: str, **extra: Any) -> httpx.Response:
    content = [{"type": "text", "text": "What is it?"}, {"type": "image_url", "image_url": {"url": image}}]
    body = {"model": "echo", "messages": [{"role": "user", "content": content}], **extra}
    return httpx.post(f"{url}/v3/chat/completions", json=body, timeout=30)


def test_the_ovms_dialect_screens_images_before_any_backend(gateway: tuple[str, Path]):
    url, root = gateway
    assert ovms(url, str(root / "zebra.png")).status_code == 200
    assert ovms(url, "data:image/png;base64,iVBORw0KGgo=").status_code == 200
    for bad in (
        "../../etc/passwd",
        "/etc/passwd",
        "junk",
        "http://127.0.0.1:1/x.png",
        str(root / ".." / "x"),
    ):
        response = ovms(url, bad)
        assert response.status_code == 400, (bad, response.text)
        assert set(response.json()) == {"error"}
    streamed = ovms(url, "../../etc/passwd", stream=True)
    assert streamed.status_code == 400  # before any byte of a stream
