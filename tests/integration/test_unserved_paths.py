"""Paths nothing serves, against the app: each answer is in the access log and in the request
metrics (under the one route label `unmatched`, never the path), and its 404 says, in the
dialect's own shape, what this gateway serves instead."""

from __future__ import annotations

import asyncio
import random
import re
import socket
import string
from typing import Any, cast

import httpx
import orjson
import pytest
from asgi_lifespan import LifespanManager

from gateway.app import build_gateway
from gateway.config.settings import Key, Settings
from gateway.policy.auth import new_key
from gateway.telemetry.access_log import PATH_LOGGED, AccessLog
from tests.support.servers import running_gateway

HOST = "http://gw.test"
API_VERSION = "api-version=2024-05-01-preview"
CHAT = {"model": "echo", "messages": [{"role": "user", "content": "hi"}]}
KEY, KEY_SHA = new_key()
REQUESTS = re.compile(r"^chatgate_requests_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$", re.MULTILINE)


class Lines(list[str]):
    """The access log's sink, kept in memory."""

    def write_line(self, line: str) -> None:
        self.append(line)


Ask = tuple[str, str] | tuple[str, str, dict[str, Any]]


def answers(settings: Settings, asks: list[Ask]) -> tuple[list[httpx.Response], list[dict], str]:
    """The app's answers to `asks` (method, path[, headers]), its access-log lines, its /metrics."""
    lines = Lines()
    gateway = build_gateway(settings, AccessLog(cast(Any, lines)))

    async def run() -> tuple[list[httpx.Response], str]:
        async with LifespanManager(gateway.app) as started:
            transport = httpx.ASGITransport(app=started.app)
            async with httpx.AsyncClient(transport=transport, base_url=HOST) as client:
                found = []
                for ask in asks:
                    method, path, headers = ask if len(ask) == 3 else (*ask, {})
                    body = CHAT if method in ("POST", "DELETE") else None
                    found.append(await client.request(method, path, json=body, headers=headers))
                return found, (await client.get("/metrics")).text

    responses, metrics = asyncio.run(run())
    return responses, [orjson.loads(line) for line in lines], metrics


def requests_counted(metrics: str) -> dict[str, float]:
    return {match["labels"]: float(match["value"]) for match in REQUESTS.finditer(metrics)}


def labels(deployment: str, dialect: str, key: str, route: str, status: int) -> str:
    return f'deployment="{deployment}",dialect="{dialect}",key="{key}",route="{route}",status="{status}"'


def message(response: httpx.Response) -> str:
    body = response.json()
    return body["error"]["message"]


def test_every_answer_is_in_the_access_log_and_the_metrics():
    asks: list[Ask] = [
        ("POST", "/v1/embeddings"),
        ("GET", "/nothing/here"),
        ("DELETE", "/v1/chat/completions"),
        ("GET", "/v1/ui/missing.js"),
        ("GET", "/v1/openapi.json"),
        ("POST", "/v1/chat/completions"),
        ("GET", "/health"),  # the gateway's own endpoints are polled, not asked: not logged
    ]
    responses, lines, metrics = answers(Settings(), asks)
    assert [r.status_code for r in responses] == [404, 404, 405, 404, 200, 200, 200]
    assert len(lines) == 6
    for response, line in zip(responses, lines, strict=False):
        assert line["request_id"] == response.headers["x-request-id"]
        assert line["status"] == response.status_code
    assert [(line["path"], line["route"]) for line in lines] == [
        ("/v1/embeddings", "unmatched"),
        ("/nothing/here", "unmatched"),
        ("/v1/chat/completions", "/v1/chat/completions"),
        ("/v1/ui/missing.js", "unmatched"),
        ("/v1/openapi.json", "/v1/openapi.json"),
        ("/v1/chat/completions", "/v1/chat/completions"),
    ]
    assert [line["error"] for line in lines[:4]] == ["NotFound", "NotFound", "MethodNotAllowed", "NotFound"]
    counted = requests_counted(metrics)
    assert counted[labels("none", "openai", "none", "unmatched", 404)] == 2
    assert counted[labels("none", "none", "none", "unmatched", 404)] == 1
    assert counted[labels("none", "openai", "none", "/v1/chat/completions", 405)] == 1
    assert counted[labels("echo", "openai", "anonymous", "/v1/chat/completions", 200)] == 1
    assert 'chatgate_request_errors_total{code="NotFound",deployment="none",dialect="openai"} 2.0' in metrics
    assert "chatgate_requests_in_flight 0.0" in metrics


def test_many_random_paths_are_one_label():
    """A client that sends thousands of made-up paths adds no series: they are one route."""
    rng = random.Random(38)
    prefixes = ["", "/v1", "/azure", "/anthropic/v1", "/lmi", "/v3", "/aleph-alpha"]
    paths = [
        f"{rng.choice(prefixes)}/{''.join(rng.choices(string.ascii_lowercase, k=12))}" for _ in range(300)
    ]
    responses, lines, metrics = answers(Settings(), [("GET", path) for path in paths])
    assert {r.status_code for r in responses} == {404}
    assert [line["path"] for line in lines] == paths  # the log has each path; the metrics none
    counted = requests_counted(metrics)
    routes = {re.search(r'route="([^"]*)"', labels)[1] for labels in counted}  # type: ignore[index]
    assert routes == {"unmatched"}
    assert sum(counted.values()) == len(paths)
    assert len(counted) <= len(prefixes)  # one series per dialect the paths lay under, at most
    assert not any(path.rsplit("/", 1)[1] in metrics for path in paths)


@pytest.mark.parametrize("mount", ["/azure", "/inference"])
@pytest.mark.parametrize(
    "shape",
    ["/openai/deployments/echo/chat/completions", "/deployments/echo/chat/completions",
     "/openai/v1/chat/completions"],
)  # fmt: skip
def test_an_azure_openai_path_names_the_azure_mount_and_its_api_version(mount: str, shape: str):
    settings = Settings(mounts={"azure": mount})
    hint = f"{mount}/chat/completions?{API_VERSION}"
    asks: list[Ask] = [("POST", f"{mount}{shape}?api-version=2024-10-21"), ("POST", hint)]
    responses, lines, _ = answers(settings, asks)
    refused, followed = responses
    assert refused.status_code == 404 and refused.headers["x-ms-error-code"] == "NotFound"
    body = refused.json()
    assert body["status"] == 404 and body["error"]["code"] == "NotFound"  # Azure's own error shape
    said = body["error"]["message"]
    assert f"POST {hint}" in said and "Azure OpenAI" in said
    assert f'OpenAI(base_url="{HOST}{mount}", default_query={{"api-version": "2024-05-01-preview"}})' in said
    assert "2024-10-21" not in said  # the query string is neither echoed nor logged
    assert followed.status_code == 200, followed.text  # the hint, followed, is served
    assert lines[0]["path"] == f"{mount}{shape}" and lines[0]["dialect"] == "azure"


def test_unserved_openai_apis_say_so_and_list_what_is_served():
    responses, _, _ = answers(Settings(), [("POST", "/v1/embeddings"), ("POST", "/v1/completions"),
                                           ("POST", "/v1/audio/speech")])  # fmt: skip
    assert [r.status_code for r in responses] == [404, 404, 404]
    embeddings, completions, audio = map(message, responses)
    assert "chatgate does not serve embeddings" in embeddings
    assert "does not serve text completions" in completions and "does not serve audio" in audio
    for said in (embeddings, completions, audio):
        assert "On /v1 (OpenAI) this gateway serves: POST /v1/chat/completions" in said
        assert "POST /v1/responses" in said
    assert responses[0].json()["error"]["code"] == "NotFound"  # OpenAI's error shape


def test_anthropic_at_the_root_and_a_doubled_v1_are_pointed_home():
    asks: list[Ask] = [("POST", "/v1/messages"), ("POST", "/v1/v1/chat/completions")]
    responses, _, _ = answers(Settings(), [*asks, ("POST", "/anthropic/v1/v1/messages")])
    messages, doubled, anthropic = responses
    assert "POST /anthropic/v1/messages" in message(messages)
    assert f"ANTHROPIC_BASE_URL={HOST}/anthropic" in message(messages)
    assert "once too often" in message(doubled) and "POST /v1/chat/completions" in message(doubled)
    body = anthropic.json()  # Anthropic's own error shape
    assert body["type"] == "error" and body["error"]["type"] == "not_found_error"
    assert "once too often" in body["error"]["message"]


def test_a_keyed_gateway_tells_a_caller_without_a_key_what_its_documents_publish():
    """The 404 comes before any key is asked for (the path names no operation whose scheme could
    be checked) and says only what the served documents publish to anyone: mounts, paths, the
    required api-version. No deployment, model or key name."""
    deployments = [{"name": "secret-deployment", "backend": "echo", "model": "secret-model"}]
    keyed = Settings(keys=[Key(name="secret-team", sha256=KEY_SHA)], deployments=deployments)
    open_ = Settings(deployments=deployments)
    asks: list[Ask] = [
        ("POST", "/v1/embeddings"),
        ("POST", "/azure/openai/deployments/x/chat/completions"),
        ("GET", "/nothing"),
        ("POST", "/chat/completions"),
    ]
    keyed_answers, _, _ = answers(keyed, [*asks, ("POST", "/v1/chat/completions")])
    open_answers, _, _ = answers(open_, asks)
    assert keyed_answers[-1].status_code == 401  # the keys are enforced
    for keyed_answer, open_answer in zip(keyed_answers, open_answers, strict=False):
        assert keyed_answer.status_code == 404
        assert "secret" not in keyed_answer.text
        assert message(keyed_answer) == message(open_answer)
    documented = {path for d in ("/v1", "/azure") for path in documented_paths(keyed, d)}
    for named in re.findall(r"(?:GET|POST) (/[^ ?,;)]+)", message(keyed_answers[0])):
        assert named.rstrip(".") in documented, named


def documented_paths(settings: Settings, mount: str) -> set[str]:
    """The paths the gateway's served document at `mount` publishes, as mounted."""
    responses, _, _ = answers(settings, [("GET", f"{mount}/openapi.json")])
    return {mount + path for path in responses[0].json()["paths"]}


def test_the_access_log_shows_a_path_bounded_and_terminal_safe():
    long_path = "/v1/" + "a" * 5000
    hostile_path = "/v1/%1B]0;owned%07%C2%9B%E2%80%AE"
    responses, lines, _ = answers(Settings(), [("GET", hostile_path), ("GET", long_path)])
    assert [r.status_code for r in responses] == [404, 404]
    hostile, long = lines[0]["path"], lines[1]["path"]
    assert not any(character in hostile for character in "\x1b\x07\x9b\u202e")
    assert hostile == "/v1/\\x1b]0;owned\\x07\\x9b\\u202e"
    assert len(long) == PATH_LOGGED and long.endswith("…")
    assert len(message(responses[1])) < 2000


def test_a_request_the_connection_refuses_is_logged_and_counted(log_dir):
    """Refused before it is routed (here: not HTTP at all): route `edge`."""
    with running_gateway(log_dir) as url:
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as raw:
            raw.sendall(b"NOT HTTP AT ALL\r\n\r\n")
            answer = raw.recv(65536)
        metrics = httpx.get(f"{url}/metrics").text
        log = max(log_dir.glob("gateway-*.log"), key=lambda p: p.stat().st_mtime)
    assert answer.startswith(b"HTTP/1.1 400")
    counted = requests_counted(metrics)
    assert counted[labels("none", "none", "none", "edge", 400)] == 1
    lines = [orjson.loads(line) for line in log.read_text().splitlines() if line.startswith('{"ts"')]
    assert [(line["route"], line["status"], line["error"]) for line in lines] == [("edge", 400, "BadRequest")]
