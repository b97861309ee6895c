"""OVMS's images (gateway/policy/media.py), with real files, symlinks and resolved names: base64
data URLs pass, http(s) URLs pass only toward public addresses, local paths are read only under
the allowed directory (symlinks resolved, no `..`) and passed on as data URLs; anything else is
refused in the dialect's shape, before any backend: 400 for what is none of the three forms, 403
for a form this server does not take from there, 404 for no file. Then through a gateway."""

from __future__ import annotations

import asyncio
import base64
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.config import Media
from gateway.core.canonical import ChatRequest
from gateway.core.errors import BadRequest, Forbidden, GatewayError, NotFound
from gateway.policy.media import MediaPolicy, system_resolver
from gateway.spec import load_document
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
    if not host.isascii():
        return await system_resolver(host)  # what the system's resolver makes of a name that is none
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


def refusal(policy: MediaPolicy, url: str, kind: type[GatewayError] = BadRequest) -> GatewayError:
    """400: not one of the three forms; 403: a form this server does not take; 404: no file."""
    with pytest.raises(GatewayError) as raised:
        asyncio.run(policy.screen(request_with(url)))
    error = raised.value
    assert type(error) is kind, error
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


PRIVATE = [
    "http://localhost/zebra.png",
    "http://127.0.0.1:8080/zebra.png",
    "http://[::1]/zebra.png",
    "http://[::ffff:127.0.0.1]/zebra.png",
    "http://169.254.169.254/latest/meta-data/",
    "http://metadata.internal/latest",
    "http://10.1.2.3/zebra.png",
    "http://192.168.0.10/zebra.png",
    "http://172.16.5.4/zebra.png",
    "http://[fd00::1]/zebra.png",
    "http://[fe80::1%25eth0]/zebra.png",
    "http://0.0.0.0/zebra.png",
    "http://rebind.example.com/zebra.png",
]


@pytest.mark.parametrize("url", PRIVATE)
def test_urls_toward_loopback_link_local_or_private_ranges_are_refused(media_dir: Path, url: str):
    assert "private address" in refusal(policy(media_dir), url, Forbidden).message


@pytest.mark.parametrize(
    ("url", "why", "kind"),
    [
        ("http://no-such-host.example/zebra.png", "cannot be resolved", Forbidden),
        ("http://bad\x8ahost/zebra.png", "cannot be resolved", Forbidden),  # not even a name (idna)
        ("http://[zz]/zebra.png", "cannot be resolved", Forbidden),  # a bracketed host that is no address
        ("http://a\uff03b/zebra.png", "cannot be resolved", Forbidden),  # NFKC makes it a delimiter
        ("https://:\U00024c52s", "no host", BadRequest),  # found by the OVMS fuzz: a port, no host
        ("http://user@:8080/zebra.png", "no host", BadRequest),
        ("https:///zebra.png", "no host", BadRequest),
        ("data:image/png,not-base64", "base64", BadRequest),
    ],
)
def test_unresolvable_hosts_and_junk_urls_are_refused(media_dir: Path, url: str, why: str, kind: type):
    assert why in refusal(policy(media_dir), url, kind).message


def test_a_local_path_under_the_directory_is_read_into_a_data_url(media_dir: Path):
    expected = "data:image/png;base64," + base64.b64encode(PNG).decode()
    assert screened(policy(media_dir), str(media_dir / "animals" / "zebra.png")) == expected
    assert screened(policy(media_dir), str(media_dir / "link-in")) == expected  # a symlink that stays in
    assert screened(policy(media_dir), str(media_dir.parent / "elsewhere" / "zebra.png")) == expected


@pytest.mark.parametrize(
    ("relative", "kind"),
    [
        ("../secret.txt", BadRequest),  # `..` is refused whatever it resolves to
        ("animals/../animals/zebra.png", BadRequest),
        ("link-out", Forbidden),  # a symlink leading out
        ("animals", NotFound),  # a directory
        ("nothing-here.png", NotFound),
        ("big.png", BadRequest),  # above max_local_media_bytes
    ],
)
def test_local_paths_that_leave_the_directory_or_are_no_file_are_refused(
    media_dir: Path, relative: str, kind: type
):
    refusal(policy(media_dir), f"{media_dir}/{relative}", kind)


@pytest.mark.parametrize(
    ("url", "kind"),
    [
        ("/etc/passwd", Forbidden),
        ("../../etc/passwd", BadRequest),
        ("zebra.png", BadRequest),
        ("file:///etc/passwd", BadRequest),
        ("junk", BadRequest),
        ("", BadRequest),
    ],
)
def test_outside_paths_relative_paths_and_junk_are_refused(media_dir: Path, url: str, kind: type):
    refusal(policy(media_dir), url, kind)


def test_without_a_directory_no_local_path_is_read(media_dir: Path):
    error = refusal(policy(None), str(media_dir / "animals" / "zebra.png"), Forbidden)
    assert "not allowed on this server" in error.message


def test_the_documents_pattern_says_the_three_forms_too():
    """ovms.yaml's ImageUrl pattern admits what the policy takes as one of the three forms (the
    front door answers the rest with 400 first)."""
    schema = load_document("ovms.yaml")["components"]["schemas"]["ImageUrl"]
    pattern = re.compile(schema["properties"]["url"]["pattern"])
    for url in [*PASSED_ON, *PRIVATE, "/srv/media/a.png", "/srv/media/./a.png", "/srv/.hidden/..b"]:
        assert pattern.match(url), url
    for url in ("../../etc/passwd", "/srv/../etc/passwd", "/srv/..", "junk", "", "zebra.png", "file:///etc"):
        assert not pattern.match(url), url
    for url in ("https:///zebra.png", "https://:\U00024c52s", "http://user@:8080/", "http://h:1@/x"):
        assert not pattern.match(url), url  # no host: the document refuses it, not only the policy


URL_PATTERN = load_document("ovms.yaml")["components"]["schemas"]["ImageUrl"]["properties"]["url"]["pattern"]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(url=st.from_regex(URL_PATTERN, fullmatch=True))
def test_what_the_documents_pattern_admits_the_policy_never_calls_malformed(url: str):
    """The schemathesis check `positive_data_acceptance`: a URL the document admits may be
    refused by this server (403, 404) but never as malformed (400). The OVMS fuzz found
    `https://:…`, which the old pattern (`https?://.+`) admitted and the policy called hostless."""

    async def offline(host: str) -> list[str]:
        if host not in NAMES:
            raise OSError(f"unknown host {host}")
        return NAMES[host]

    try:
        asyncio.run(MediaPolicy(Media(), offline).screen(request_with(url)))
    except GatewayError as error:
        assert type(error) is not BadRequest, (url, error.message)


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
    for bad, status in [
        ("../../etc/passwd", 400),
        (str(root / ".." / "x"), 400),
        ("junk", 400),
        ("/etc/passwd", 403),
        ("http://127.0.0.1:1/x.png", 403),
        (str(root / "nothing.png"), 404),
    ]:
        response = ovms(url, bad)
        assert response.status_code == status, (bad, response.text)
        assert set(response.json()) == {"error"}
    streamed = ovms(url, "/etc/passwd", stream=True)
    assert streamed.status_code == 403  # before any byte of a stream
