"""Remote images fetched by the gateway (`media.remote_images: fetch`, gateway/policy/media_fetch.py),
from a real HTTP server on loopback (tests/support/media_upstream.py). Loopback is not public, so the tests
allow 127.0.0.1/32 the way an operator allows an internal image store
(`media.allowed_private_networks`); every other non-public address stays refused, redirects
included. Issue 24, item 7: what is screened is what is fetched, and no redirect or second DNS
answer reaches an address the screen did not allow. First in-process, then through `chatgate
serve` with an OpenAI-compatible upstream that keeps what the gateway sent it."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.config.settings import Media, MediaFetch
from gateway.core.canonical import ChatRequest
from gateway.core.errors import Forbidden, GatewayError, PayloadTooLarge, UnprocessableContent
from gateway.policy.media import MediaPolicy
from tests.support.gateway_process import gateway_process
from tests.support.media_upstream import PNG, MediaUpstream
from tests.support.servers import free_port

FETCH_TIMEOUT = 2.0
MAX_BYTES = 1024 * 1024  # /big.png and /endless.png send 3 MiB
ZEBRA_DATA_URL = "data:image/png;base64," + base64.b64encode(PNG).decode()


@pytest.fixture(scope="module")
def upstream() -> Iterator[MediaUpstream]:
    with MediaUpstream() as server:
        yield server


class Names:
    """A resolver that counts its lookups; `later` is what a name resolves to after the first
    lookup (a rebinding DNS server's second answer)."""

    def __init__(self, first: dict[str, list[str]], later: dict[str, list[str]] | None = None) -> None:
        self.first, self.later = first, later or {}
        self.lookups: list[str] = []

    async def __call__(self, host: str) -> list[str]:
        answers = self.later if host in self.lookups and host in self.later else self.first
        self.lookups.append(host)
        if host not in answers:
            raise OSError(f"unknown host {host}")
        return answers[host]


def fetching_policy(resolve: Names | None = None, **media: Any) -> MediaPolicy:
    settings = Media(
        remote_images="fetch",
        allowed_private_networks=["127.0.0.1/32"],
        fetch=MediaFetch(timeout=FETCH_TIMEOUT, max_bytes=MAX_BYTES),
        **media,
    )
    return MediaPolicy(settings, resolve or Names({}))


def request_with(*urls: str) -> ChatRequest:
    content: list[dict[str, Any]] = [{"type": "text", "text": "What is it?"}]
    content += [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    return ChatRequest(model="m", messages=[{"role": "user", "content": content}])


def fetched(policy: MediaPolicy, *urls: str) -> list[str]:
    request = request_with(*urls)
    asyncio.run(policy.screen(request))
    return [part["image_url"]["url"] for part in request.messages[0]["content"][1:]]


def refusal(policy: MediaPolicy, url: str, kind: type[GatewayError]) -> GatewayError:
    with pytest.raises(GatewayError) as raised:
        asyncio.run(policy.screen(request_with(url)))
    assert type(raised.value) is kind, raised.value
    assert raised.value.message.startswith("messages[0].content[1].image_url.url: ")
    return raised.value


def test_an_image_is_fetched_and_passed_on_as_a_data_url(upstream: MediaUpstream):
    assert fetched(fetching_policy(), f"{upstream.url}/zebra.png") == [ZEBRA_DATA_URL]


def test_a_name_is_looked_up_once_and_the_connection_goes_to_the_address_screened(upstream: MediaUpstream):
    """`images.test` exists in no DNS: the fetch reaches the server only through the address the
    screen checked. A second lookup would get a private address (DNS rebinding): there is none."""
    port = upstream.url.rsplit(":", 1)[1]
    names = Names({"images.test": ["127.0.0.1"]}, later={"images.test": ["10.0.0.9"]})
    url = f"http://images.test:{port}/zebra.png?name=pinned"
    assert fetched(fetching_policy(names), url, url) == [ZEBRA_DATA_URL, ZEBRA_DATA_URL]
    assert names.lookups == ["images.test"]
    requests = [seen for seen in upstream.requests_to("/zebra.png") if "pinned" in seen.path]
    assert len(requests) == 1  # the same URL twice is fetched once
    assert requests[0].headers["host"] == f"images.test:{port}"


def test_a_redirect_to_an_allowed_address_is_followed(upstream: MediaUpstream):
    assert fetched(fetching_policy(), f"{upstream.url}/redirect?to=/zebra.png") == [ZEBRA_DATA_URL]


@pytest.mark.parametrize(
    "target",
    [
        "http://127.0.0.2:{port}/zebra.png",  # loopback, but not the network allowed
        "http://169.254.169.254/latest/meta-data/",
        "http://[::ffff:169.254.169.254]/latest/meta-data/",
        "http://[64:ff9b::a9fe:a9fe]/latest/meta-data/",
        "http://metadata.test/latest/meta-data/",
        "http://localhost:{port}/zebra.png",  # 127.0.0.1 and ::1: one address not allowed is enough
        "http://10.0.0.9/zebra.png",
    ],
)
def test_a_redirect_to_an_address_not_allowed_is_refused(upstream: MediaUpstream, target: str):
    port = upstream.url.rsplit(":", 1)[1]
    names = Names({"metadata.test": ["169.254.169.254"], "localhost": ["127.0.0.1", "::1"]})
    location = target.format(port=port)
    error = refusal(fetching_policy(names), f"{upstream.url}/redirect?to={location}", Forbidden)
    assert "a redirect to" in error.message and "public addresses" in error.message


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("/redirect?to=file:///etc/passwd", "does not follow"),
        ("/redirect?to=http://127.0.0.1%5C@8.8.8.8/x.png", "backslash"),
        ("/loop", "more than 3 redirects (media.fetch.max_redirects)"),
        ("/page.html", "not an image"),
        ("/gzip.png", "Content-Encoding: gzip"),
        ("/missing.png", "answered 404"),
    ],
)
def test_what_is_no_image_is_refused(upstream: MediaUpstream, path: str, why: str):
    error = refusal(fetching_policy(), f"{upstream.url}{path}", UnprocessableContent)
    assert why in error.message and error.code == "ImageNotFetched"


def test_an_address_nothing_listens_on_is_refused():
    error = refusal(fetching_policy(), f"http://127.0.0.1:{free_port()}/zebra.png", UnprocessableContent)
    assert "connection failed" in error.message


@pytest.mark.parametrize("path", ["/big.png", "/endless.png"])  # its length said, or not
def test_an_image_over_the_cap_is_refused(upstream: MediaUpstream, path: str):
    error = refusal(fetching_policy(), f"{upstream.url}{path}", PayloadTooLarge)
    assert f"larger than {MAX_BYTES} bytes (media.fetch.max_bytes)" in error.message


def test_the_request_s_images_together_are_capped(upstream: MediaUpstream):
    policy = fetching_policy(max_media_bytes_per_request=len(PNG) + 10)
    with pytest.raises(PayloadTooLarge, match=r"media\.max_media_bytes_per_request"):
        asyncio.run(policy.screen(request_with(f"{upstream.url}/zebra.png", f"{upstream.url}/zebra.png?2")))


def test_a_server_that_does_not_answer_is_given_up_on(upstream: MediaUpstream):
    started = time.monotonic()
    error = refusal(fetching_policy(), f"{upstream.url}/slow.png", UnprocessableContent)
    assert "media.fetch.timeout" in error.message
    assert time.monotonic() - started < FETCH_TIMEOUT + 10  # given up on, not waited out


def test_by_default_no_image_is_taken_by_url(upstream: MediaUpstream):
    requests = len(upstream.seen)
    error = refusal(MediaPolicy(Media()), f"{upstream.url}/zebra.png", Forbidden)
    assert "media.remote_images" in error.message
    assert len(upstream.seen) == requests


# ----- through the gateway ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, upstream: MediaUpstream) -> Iterator[str]:
    config = {
        "media": {
            "remote_images": "fetch",
            "allowed_private_networks": ["127.0.0.1/32"],
            "fetch": {"timeout": FETCH_TIMEOUT, "max_bytes": MAX_BYTES},
        },
        "deployments": [
            {"name": "vision", "backend": "openai-compatible", "models": ["*"],
             "options": {"base_url": f"{upstream.url}/v1"}},
        ],
    }  # fmt: skip
    with gateway_process(tmp_path_factory.mktemp("media-fetch"), config) as process:
        yield process.url


def ovms(url: str, image: str) -> httpx.Response:
    content = [{"type": "text", "text": "What is it?"}, {"type": "image_url", "image_url": {"url": image}}]
    body = {"model": "vision", "messages": [{"role": "user", "content": content}]}
    return httpx.post(f"{url}/v3/chat/completions", json=body, timeout=30)


def test_the_gateway_sends_the_fetched_image_upstream(gateway: str, upstream: MediaUpstream):
    response = ovms(gateway, f"{upstream.url}/zebra.png?through=gateway")
    assert response.status_code == 200, response.text
    sent = upstream.chat_bodies()[-1]["messages"][0]["content"][1]["image_url"]["url"]
    assert sent == ZEBRA_DATA_URL


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("/redirect?to=http://127.0.0.2/zebra.png", 403),
        ("/redirect?to=http://169.254.169.254/latest/meta-data/", 403),
        ("/big.png", 413),
        ("/slow.png", 422),
        ("/page.html", 422),
    ],
)
def test_the_gateway_refuses_in_the_dialect_s_shape_before_the_upstream(
    gateway: str, upstream: MediaUpstream, path: str, status: int
):
    chats = len(upstream.chat_bodies())
    response = ovms(gateway, f"{upstream.url}{path}")
    assert response.status_code == status, response.text
    assert set(response.json()) == {"error"}
    assert response.json()["error"].startswith("messages[0].content[1].image_url.url: ")
    assert len(upstream.chat_bodies()) == chats  # no backend was asked


def test_a_client_that_leaves_stops_the_fetch(
    tmp_path_factory: pytest.TempPathFactory, upstream: MediaUpstream
):
    """The fetch would wait 60 s for /slow.png; the client gives up after 1 s, and the gateway
    hangs up on the image server soon after, not when its own timeout runs out."""
    config = {
        "media": {
            "remote_images": "fetch",
            "allowed_private_networks": ["127.0.0.1/32"],
            "fetch": {"timeout": 60},
        }
    }
    with gateway_process(tmp_path_factory.mktemp("media-patient"), config) as process:
        upstream.slow_hung_up.clear()
        content = [{"type": "image_url", "image_url": {"url": f"{upstream.url}/slow.png?patient"}}]
        body = {"model": "echo", "messages": [{"role": "user", "content": content}]}
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{process.url}/v3/chat/completions", json=body, timeout=1)
        assert upstream.slow_hung_up.wait(15), "the gateway still waits for the image"


# ----- forwarded (media.remote_images: forward) ---------------------------------------------------


@pytest.fixture(scope="module")
def forwarding_gateway(tmp_path_factory: pytest.TempPathFactory, upstream: MediaUpstream) -> Iterator[str]:
    config = {
        "media": {"remote_images": "forward"},
        "deployments": [
            {"name": "vision", "backend": "openai-compatible", "models": ["*"],
             "options": {"base_url": f"{upstream.url}/v1"}},
        ],
    }  # fmt: skip
    with gateway_process(tmp_path_factory.mktemp("media-forward"), config) as process:
        yield process.url


@pytest.mark.parametrize(
    ("image", "status"),
    [
        ("http://127.0.0.1\\@8.8.8.8/x.png", 400),  # the attack: screened as 8.8.8.8, read as 127.0.0.1
        ("http://user:pw@8.8.8.8/x.png", 400),
        ("http://[::127.0.0.1]/x.png", 403),
        ("http://[::7f00:1]/x.png", 403),
        ("http://[64:ff9b::7f00:1]/x.png", 403),
        ("http://[64:ff9b::a9fe:a9fe]/x.png", 403),
        ("http://[2002:7f00:1::]/x.png", 403),
    ],
)
def test_the_attack_s_urls_are_refused_through_the_gateway(
    forwarding_gateway: str, upstream: MediaUpstream, image: str, status: int
):
    chats = len(upstream.chat_bodies())
    response = ovms(forwarding_gateway, image)
    assert response.status_code == status, response.text
    assert "image_url" in response.json()["error"]  # names the field
    assert len(upstream.chat_bodies()) == chats


def test_the_gateway_forwards_the_url_it_screened(forwarding_gateway: str, upstream: MediaUpstream):
    response = ovms(forwarding_gateway, "http://1.1/a b.png?q=1#fragment")
    assert response.status_code == 200, response.text
    sent = upstream.chat_bodies()[-1]["messages"][0]["content"][1]["image_url"]["url"]
    assert sent == "http://1.0.0.1/a%20b.png?q=1"


def test_the_images_a_worker_holds_at_once_are_bounded(tmp_path: Path, upstream: MediaUpstream):
    """Four requests at once, each fetching an image whose first 1.5 MB arrive and the rest never
    does, against 4 MiB a worker may hold: some are refused with 503 MediaBusy while the others
    hold theirs; once they end (the fetch's time runs out), what they held is given back."""
    config = {
        "media": {
            "remote_images": "fetch",
            "allowed_private_networks": ["127.0.0.1/32"],
            "max_media_bytes_in_flight": 4 * 1024 * 1024,
            "fetch": {"timeout": 3, "max_bytes": MAX_BYTES * 4},
        },
        "deployments": [{"name": "vision", "backend": "echo"}],
    }
    with gateway_process(tmp_path, config) as process, ThreadPoolExecutor(4) as pool:
        held = f"{upstream.url}/held.png?bytes=1500000"
        answers = list(pool.map(lambda _: ovms(process.url, held), range(4)))
        statuses = sorted(answer.status_code for answer in answers)
        busy = [answer for answer in answers if answer.status_code == 503]
        assert busy, statuses
        assert all("max_media_bytes_in_flight" in answer.json()["error"] for answer in busy)
        assert set(statuses) <= {422, 503}, statuses  # the held ones ran out of time
        after = ovms(process.url, f"{upstream.url}/zebra.png")
        assert after.status_code == 200, after.text
