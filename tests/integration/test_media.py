"""OVMS's images (gateway/policy/media.py), with real files, symlinks and resolved names: base64
data URLs pass, http(s) URLs (when the server takes them) pass only toward public addresses and
rebuilt from what was screened, local paths are read only under the allowed directory (symlinks
resolved, no `..`, no control character) and passed on as data URLs; anything else is refused in
the dialect's shape, before any backend: 400 for what is none of the three forms, 403 for a form
this server does not take from there, 404 for no file. Then through a gateway. Fetching is in
test_media_fetch.py, the per-request limits in test_media_limits.py."""

from __future__ import annotations

import asyncio
import base64
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import urllib3  # what the attack's upstream read URLs with (here through requests, a test dependency)
import yaml
import yarl  # aiohttp's URL parser (the openai-compatible backend's client)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.config.settings import Media
from gateway.core.canonical import ChatRequest
from gateway.core.errors import BadRequest, Forbidden, GatewayError, NotFound, PayloadTooLarge
from gateway.core.lookups import IMAGE_HOSTS
from gateway.http.documents import load_document
from gateway.policy.media import MediaPolicy
from gateway.policy.media_url import parse_image_url
from tests.support.servers import running_gateway

PNG = b"\x89PNG\r\n\x1a\n-a-small-image"
NAMES = {
    "images.example.com": ["93.184.216.34"],
    "dual.example.com": ["93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946"],
    "rebind.example.com": ["93.184.216.34", "10.0.0.7"],  # one private address is enough to refuse
    "localhost": ["127.0.0.1", "::1"],
    "metadata.internal": ["169.254.169.254"],
    "xn--bcher-kva.example": ["93.184.216.34"],  # bücher.example
}


async def fake_resolver(host: str) -> list[str]:
    if not host.isascii():
        return await IMAGE_HOSTS.addresses(host)  # what the system's resolver makes of a name that is none
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


def policy(root: Path | None, max_bytes: int = 1024, remote_images: str = "forward") -> MediaPolicy:
    settings = Media(
        allowed_local_media_path=root, max_local_media_bytes=max_bytes, remote_images=remote_images
    )
    return MediaPolicy(settings, fake_resolver)


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


@pytest.mark.parametrize(
    ("sent", "forwarded"),
    [
        ("HTTPS://Images.Example.COM/a b.png?x=1 2#part", "https://images.example.com/a%20b.png?x=1%202"),
        ("http://93.184.216.34:0080/x.png", "http://93.184.216.34:80/x.png"),
        ("http://93.184.216.34", "http://93.184.216.34/"),
        ("http://1.1/x.png", "http://1.0.0.1/x.png"),  # WHATWG and getaddrinfo read 1.1 as 1.0.0.1
        ("http://0x5d.0xb8.0xd8.0x22/x.png", "http://93.184.216.34/x.png"),
        ("http://1572395042/x.png", "http://93.184.216.34/x.png"),
        ("http://[::ffff:93.184.216.34]/x.png", "http://[::ffff:5db8:d822]/x.png"),
        ("http://b\u00fccher.example/\u00fc.png", "http://xn--bcher-kva.example/%C3%BC.png"),
        ("http://images.example.com/%41?a=%2F", "http://images.example.com/%41?a=%2F"),  # escapes kept
    ],
)
def test_a_forwarded_url_is_rebuilt_from_what_was_screened(media_dir: Path, sent: str, forwarded: str):
    """Host, port, path and query as read, written back in one spelling every parser reads the
    same way (the host WHATWG's URL and getaddrinfo would reach; IDNA names in ASCII)."""
    assert screened(policy(media_dir), sent) == forwarded


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://127.0.0.1\\@8.8.8.8/x.png", "backslash"),  # the attack: urllib3 and WHATWG read 127.0.0.1
        ("http://8.8.8.8\\x.png", "backslash"),
        ("http://user:secret@93.184.216.34/x.png", "user information"),
        ("http://@93.184.216.34/x.png", "user information"),
        ("http://127.0.0.1\t.8.8.8.8/x.png", "control character"),  # WHATWG drops tabs
        ("http://93.184.216.34/x\n.png", "control character"),
        ("http://93.184.216.34/x\x00.png", "control character"),
        ("http://93.184.216.34:8o/x.png", "port"),
    ],
)
def test_urls_that_parsers_read_differently_are_refused_naming_the_field(media_dir: Path, url: str, why: str):
    error = refusal(policy(media_dir), url, BadRequest)
    assert why in error.message
    assert error.message.startswith("messages[0].content[1].image_url.url: "), error.message


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
    # the attack's IPv6 spellings of IPv4 loopback and link-local (issue 24, item 7)
    "http://[::127.0.0.1]/zebra.png",  # IPv4-compatible
    "http://[::7f00:1]/zebra.png",
    "http://[64:ff9b::7f00:1]/zebra.png",  # NAT64, well-known prefix
    "http://[64:ff9b::a9fe:a9fe]/zebra.png",  # NAT64 of 169.254.169.254
    "http://[2002:7f00:1::]/zebra.png",  # 6to4 of 127.0.0.1
    "http://[2002:a9fe:a9fe::1]/zebra.png",  # 6to4 of 169.254.169.254
    "http://[::ffff:0:7f00:1]/zebra.png",  # IPv4-translated
    "http://[64:ff9b:1::5db8:d822]/zebra.png",  # local-use NAT64: never public
    # hosts WHATWG's URL and getaddrinfo read as IPv4 loopback
    "http://0x7f.1/zebra.png",
    "http://2130706433/zebra.png",
    "http://0177.0.0.1/zebra.png",
    "http://127.1/zebra.png",
    "http://0/zebra.png",
    "http://0x7F000001./zebra.png",
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
        ("http://user@:8080/zebra.png", "user information", BadRequest),
        ("http://1.2.3.999/zebra.png", "cannot be resolved", Forbidden),  # ends in a number, no IPv4
        ("http://%31%32%37.0.0.1/zebra.png", "cannot be resolved", Forbidden),  # WHATWG decodes it
        ("http://93.184.216.34:65536/zebra.png", "cannot be resolved", Forbidden),
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
        ("big.png", PayloadTooLarge),  # above max_local_media_bytes
        ("animals/zeb\x00ra.png", BadRequest),  # issue 24, item 13: a NUL was a 500
        ("animals/zebra.png\n", BadRequest),
        ("animals\x7f/zebra.png", BadRequest),
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
    # fullmatch: the front door's validator reads `$` as ECMA-262 does (the end, not before a
    # last newline as Python's `re.match` would)
    pattern = re.compile(schema["properties"]["url"]["pattern"])
    for url in [*PASSED_ON, *PRIVATE, "/srv/media/a.png", "/srv/media/./a.png", "/srv/.hidden/..b"]:
        assert pattern.fullmatch(url), url
    for url in ("../../etc/passwd", "/srv/../etc/passwd", "/srv/..", "junk", "", "zebra.png", "file:///etc"):
        assert not pattern.fullmatch(url), url
    for url in ("https:///zebra.png", "https://:\U00024c52s", "http://user@:8080/", "http://h:1@/x"):
        assert not pattern.fullmatch(url), url  # no host: the document refuses it, not only the policy
    for url in (
        "http://127.0.0.1\\@8.8.8.8/x.png",  # a backslash, anywhere
        "http://8.8.8.8/x\\y.png",
        "http://user:secret@93.184.216.34/x.png",  # user information
        "http://127.0.0.1\t.8.8.8.8/x.png",  # a control character, anywhere
        "http://93.184.216.34/x\x00.png",
        "/srv/media/zeb\x00ra.png",
        "/srv/media/zebra.png\n",
    ):
        assert not pattern.fullmatch(url), url


URL_PATTERN = load_document("ovms.yaml")["components"]["schemas"]["ImageUrl"]["properties"]["url"]["pattern"]
ADMITTED = st.from_regex(URL_PATTERN, fullmatch=True)


async def offline(host: str) -> list[str]:
    if host not in NAMES:
        raise OSError(f"unknown host {host}")
    return NAMES[host]


@pytest.mark.parametrize("remote_images", ["refuse", "forward"])
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(url=ADMITTED)
def test_what_the_documents_pattern_admits_the_policy_never_calls_malformed(remote_images: str, url: str):
    """The schemathesis check `positive_data_acceptance`: a URL the document admits may be
    refused by this server (403, 404) but never as malformed (400). The OVMS fuzz found
    `https://:…`, which the old pattern (`https?://.+`) admitted and the policy called hostless."""
    try:
        asyncio.run(MediaPolicy(Media(remote_images=remote_images), offline).screen(request_with(url)))
    except GatewayError as error:
        assert type(error) is not BadRequest, (url, error.message)


def hosts_read_by_parsers(url: str) -> dict[str, str | None]:
    """The host of `url` as each parser an upstream might use reads it (brackets dropped)."""
    return {
        "urllib.parse": urlsplit(url).hostname,
        "urllib3": (urllib3.util.parse_url(url).host or "").strip("[]").lower(),
        "yarl (aiohttp)": yarl.URL(url).raw_host,
        "httpx": httpx.URL(url).raw_host.decode("ascii").lower(),
    }


# URLs made of the pieces parsers disagree about: what the attack used, and more
TRICKY_PIECES = ["\\", "@", ":", "[", "]", "%", "%25", "#", "?", "/", "//", ".", "\t", " ",
                 "\u00fc", "\uff0e", "127.0.0.1", "8.8.8.8", "0x7f", "1", "::1", "ffff", "a",
                 "example.com", "80"]  # fmt: skip
TRICKY = st.lists(st.sampled_from(TRICKY_PIECES), max_size=12).map(lambda pieces: "http://" + "".join(pieces))


@settings(
    max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]
)
@given(url=st.one_of(ADMITTED.filter(lambda url: url[:4].lower() == "http"), TRICKY))
def test_what_is_forwarded_is_read_as_the_host_that_was_screened(url: str):
    """Issue 24, item 7: `http://127.0.0.1\\@8.8.8.8/x.png` was screened as 8.8.8.8 and passed on
    as sent, which urllib3 reads as 127.0.0.1. Now every URL the policy forwards (any name
    resolves to a public address here), drawn from the document's pattern or made of the pieces
    parsers disagree about, is one that urllib.parse, urllib3, yarl and httpx all read as the
    host that was screened."""

    async def public(host: str) -> list[str]:
        return ["93.184.216.34"]

    request = request_with(url)
    try:
        asyncio.run(MediaPolicy(Media(remote_images="forward"), public).screen(request))
    except GatewayError:
        return  # refused: nothing is passed on
    forwarded = request.messages[0]["content"][1]["image_url"]["url"]
    screened_host = parse_image_url(url).host
    assert set(hosts_read_by_parsers(forwarded).values()) == {screened_host}, (url, forwarded)


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
