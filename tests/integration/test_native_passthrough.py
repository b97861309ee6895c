"""A native pass-through through a real `chatgate serve`, in front of a loopback upstream that
speaks Messages and Responses with recorded frames: the body goes upstream as the client sent it
(the deployment's model, the policy's default bound), the frames come back as they came (the
client's id and model), every policy still applies (the content filter, usage in the metrics),
and a stream that breaks its dialect's order is an upstream failure, never a clean 200."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml

from tests.support.native_frames import (
    GOOD_MESSAGES,
    GOOD_RESPONSES,
    LLAMA_CREATED_TWICE,
    LLAMA_NO_MESSAGE_START,
    MESSAGE_END,
    completed,
    message_start,
    text_block,
)
from tests.support.servers import started_gateway

pytestmark = pytest.mark.integration

WHOLE_MESSAGE = {
    "id": "msg_up",
    "type": "message",
    "role": "assistant",
    "model": "upstream-model",
    "content": [{"type": "thinking", "thinking": "hm", "signature": "s"}, {"type": "text", "text": "Hi"}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {"input_tokens": 11, "output_tokens": 7, "cache_read_input_tokens": 2},
}
FORBIDDEN = "zebra"
FIRST_BYTE = 1.0  # the stalling deployment's wait for the upstream's first word
STALL_SECONDS = 4.0
STALL: dict[str, Any] = {"type": "stall"}  # where the upstream goes quiet (never written)
LOGS: dict[str, Path] = {}  # each gateway's log, by its URL
WHOLE_RESPONSE = {
    **completed()["response"],
    "output": [
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {
            "type": "message",
            "id": "msg_1",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Hi", "annotations": []}],
        },
    ],
}


def script(path: str, body: dict[str, Any]) -> tuple[str, Any]:
    """What the upstream answers: ("json", body) or ("sse", frames), by the prompt's words."""
    words = json.dumps(body.get("messages") or body.get("input"))
    if path.startswith("/broken/"):
        words = "broken"
    if path.endswith("/messages"):
        if not body.get("stream"):
            if "filter" in words:
                return "json", {**WHOLE_MESSAGE, "content": [{"type": "text", "text": f"a {FORBIDDEN}"}]}
            return "json", WHOLE_MESSAGE
        if "broken" in words:
            return "sse", LLAMA_NO_MESSAGE_START
        if "stall" in words:  # the answer opened, then nothing said for longer than the first byte's
            return "sse", [message_start(), {"type": "ping"}, STALL, *text_block(0, "late"), *MESSAGE_END]
        if "filter" in words:
            return "sse", [message_start(), *text_block(0, "a ", f"{FORBIDDEN} here"), *MESSAGE_END]
        return "sse", GOOD_MESSAGES
    if not body.get("stream"):
        return "json", WHOLE_RESPONSE
    if "broken" in words:
        return "sse", LLAMA_CREATED_TWICE
    return "sse", GOOD_RESPONSES


class Upstream(BaseHTTPRequestHandler):
    seen: list[tuple[str, dict[str, Any]]] = []

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        Upstream.seen.append((self.path, body))
        kind, answer = script(self.path, body)
        if kind == "json":
            data = orjson.dumps(answer)
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("connection", "close")
        self.end_headers()
        for frame in answer:
            time.sleep(0.02)  # one frame at a time, as a model server writes them
            if frame is STALL:
                time.sleep(STALL_SECONDS)
                continue
            self.wfile.write(f"event: {frame['type']}\ndata: {orjson.dumps(frame).decode()}\n\n".encode())
            self.wfile.flush()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, log_dir: Path) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/v1"
    config = {
        "deployments": [
            {
                "name": "native",
                "backend": "openai-compatible",
                "options": {
                    "base_url": base,
                    "upstream_model": "upstream-model",
                    "native": ["messages", "responses"],
                },
                "capabilities": {"default_max_tokens": 33},
            },
            {
                "name": "native-stalls",
                "backend": "openai-compatible",
                "options": {
                    "base_url": base,
                    "upstream_model": "upstream-model",
                    "native": ["messages"],
                    "first_byte": FIRST_BYTE,
                },
                "retries": {"attempts": 1},
            },
            {
                "name": "half-broken",
                "backend": "openai-compatible",
                "options": {"upstream_model": "upstream-model", "native": ["messages"]},
                "replicas": [
                    {"name": "broken", "options": {"base_url": f"{base[:-3]}/broken/v1"}},
                    {"name": "good", "options": {"base_url": base}},
                ],
            },
        ],
        "content_filter": {"output": {"words": [FORBIDDEN]}},
    }
    path = tmp_path_factory.mktemp("native") / "chatgate.yaml"
    path.write_text(yaml.safe_dump(config))
    try:
        with started_gateway(log_dir, path) as (_process, url, log):
            LOGS[url] = log
            yield url
    finally:
        server.shutdown()


def events(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]


def messages(gateway: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{gateway}/anthropic/v1/messages", json={"model": "native", **body}, timeout=30)


THINKING = {"type": "enabled", "budget_tokens": 1024}
USER = {
    "role": "user",
    "content": [{"type": "text", "text": "Hello", "cache_control": {"type": "ephemeral"}}],
}


def test_a_whole_message_goes_upstream_as_sent_and_comes_back_as_it_came(gateway: str) -> None:
    Upstream.seen.clear()
    answer = messages(gateway, {"max_tokens": 50, "thinking": THINKING, "messages": [USER]})
    assert answer.status_code == 200, answer.text
    assert "x-chatgate-dropped-params" not in answer.headers
    ((path, sent),) = Upstream.seen
    assert path == "/v1/messages"
    assert sent == {"model": "upstream-model", "max_tokens": 50, "thinking": THINKING, "messages": [USER]}
    body = answer.json()
    assert body["content"] == WHOLE_MESSAGE["content"]  # the thinking block is kept
    assert body["model"] == "native" and body["id"].startswith("msg_") and body["id"] != "msg_up"
    assert body["usage"] == WHOLE_MESSAGE["usage"]


def test_a_streamed_message_is_the_upstreams_frames_with_the_clients_id_and_model(gateway: str) -> None:
    Upstream.seen.clear()
    answer = messages(gateway, {"max_tokens": 9, "stream": True, "thinking": THINKING, "messages": [USER]})
    assert answer.status_code == 200, answer.text
    assert "x-chatgate-dropped-params" not in answer.headers
    (_, sent), *_ = Upstream.seen
    assert sent["stream"] is True and sent["thinking"] == THINKING
    got = events(answer.text)
    assert got[0]["message"]["model"] == "native" and got[0]["message"]["id"] != "msg_up"
    assert got[1:] == GOOD_MESSAGES[1:]
    assert [line[7:] for line in answer.text.splitlines() if line.startswith("event: ")] == [
        frame["type"] for frame in GOOD_MESSAGES
    ]


def test_a_broken_stream_before_the_first_token_is_a_502_in_anthropics_shape(gateway: str) -> None:
    answer = messages(
        gateway, {"max_tokens": 5, "stream": True, "messages": [{"role": "user", "content": "broken"}]}
    )
    assert answer.status_code == 502, answer.text
    error = answer.json()
    assert error["type"] == "error" and error["error"]["type"] == "api_error"
    assert "before message_start" in error["error"]["message"]


def test_a_native_stream_that_only_opens_the_answer_times_out_at_the_first_byte(gateway: str) -> None:
    """The head and the preamble came in time, but no word: the first byte's deadline, the
    same timer from the request to the relay's reads, ends it as a 504 in Anthropic's shape."""
    began = time.monotonic()
    answer = httpx.post(
        f"{gateway}/anthropic/v1/messages",
        json={
            "model": "native-stalls",
            "max_tokens": 5,
            "stream": True,
            "messages": [{"role": "user", "content": "stall"}],
        },
        timeout=30,
    )
    took = time.monotonic() - began
    assert answer.status_code == 504, answer.text
    error = answer.json()
    assert error["type"] == "error" and "did not answer in time" in error["error"]["message"]
    assert FIRST_BYTE <= took < STALL_SECONDS, took


def test_the_content_filter_ends_a_native_stream_with_an_error_event(gateway: str) -> None:
    answer = messages(
        gateway, {"max_tokens": 5, "stream": True, "messages": [{"role": "user", "content": "filter"}]}
    )
    assert answer.status_code == 200
    got = events(answer.text)
    assert FORBIDDEN not in answer.text
    assert got[-1]["type"] == "error" and "content filter" in got[-1]["error"]["message"]
    assert "message_stop" not in [e["type"] for e in got]


def test_a_responses_stream_passes_through_and_a_broken_one_ends_in_an_error_event(gateway: str) -> None:
    Upstream.seen.clear()
    tools = [{"type": "web_search"}, {"type": "function", "name": "f", "parameters": {"type": "object"}}]
    body = {"model": "native", "input": "Hello", "stream": True, "tools": tools}
    answer = httpx.post(f"{gateway}/v1/responses", json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    assert "x-chatgate-dropped-params" not in answer.headers
    ((path, sent),) = Upstream.seen
    assert path == "/v1/responses" and sent["tools"] == tools and sent["model"] == "upstream-model"
    assert sent["max_output_tokens"] == 33  # the deployment's default bound
    got = events(answer.text)
    assert [e["type"] for e in got] == [f["type"] for f in GOOD_RESPONSES]
    assert got[0]["response"]["model"] == "native" and got[-1]["response"]["id"] == got[0]["response"]["id"]
    assert got[-1]["response"]["id"] != "resp_up"
    broken = httpx.post(f"{gateway}/v1/responses", json={**body, "input": "broken"}, timeout=30)
    assert broken.status_code == 200  # its first token had gone out
    got = events(broken.text)
    assert got[-1]["type"] == "error" and "a second response.created" in got[-1]["message"]
    assert not any(e["type"] == "response.completed" for e in got)
    metrics = httpx.get(f"{gateway}/metrics", timeout=10).text
    assert 'chatgate_upstream_errors_total{deployment="native"' in metrics
    # the access log says how the 200 ended
    request_id = broken.headers["x-request-id"]
    lines = [json.loads(text) for text in LOGS[gateway].read_text().splitlines() if text.startswith("{")]
    (line,) = [line for line in lines if line.get("request_id") == request_id and "status" in line]
    assert (line["status"], line["error"]) == (200, "UpstreamStreamBroken")


def test_usage_is_counted_from_the_upstreams_own(gateway: str) -> None:
    before = httpx.get(f"{gateway}/metrics", timeout=10).text
    assert messages(gateway, {"max_tokens": 5, "messages": [USER]}).status_code == 200
    after = httpx.get(f"{gateway}/metrics", timeout=10).text

    def tokens(text: str, kind: str) -> float:
        for line in text.splitlines():
            if (
                line.startswith("chatgate_usage_tokens_total")
                and 'deployment="native"' in line
                and f'type="{kind}"' in line
            ):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    # the upstream's own: 11 input + 2 read from its cache, 7 output
    assert tokens(after, "input") - tokens(before, "input") == 13
    assert tokens(after, "output") - tokens(before, "output") == 7


def test_a_broken_replica_before_the_first_token_is_retried_on_another(gateway: str) -> None:
    Upstream.seen.clear()
    body = {"model": "half-broken", "max_tokens": 5, "stream": True, "messages": [USER]}
    for _ in range(10):
        answer = httpx.post(f"{gateway}/anthropic/v1/messages", json=body, timeout=30)
        assert answer.status_code == 200, answer.text
        assert events(answer.text)[-1] == {"type": "message_stop"}
    assert any(path.startswith("/broken/") for path, _ in Upstream.seen)


def test_a_whole_response_comes_back_as_it_came_and_continues_with_its_history(gateway: str) -> None:
    Upstream.seen.clear()
    first = httpx.post(f"{gateway}/v1/responses", json={"model": "native", "input": "Hello"}, timeout=30)
    assert first.status_code == 200, first.text
    body = first.json()
    assert body["output"] == WHOLE_RESPONSE["output"]  # the reasoning item is kept
    assert body["model"] == "native" and body["id"] != "resp_up"
    follow = {"model": "native", "input": "And then?", "previous_response_id": body["id"]}
    second = httpx.post(f"{gateway}/v1/responses", json=follow, timeout=30)
    assert second.status_code == 200, second.text
    _, sent = Upstream.seen[-1]
    # the upstream knows nothing of the gateway's ids: the history goes as input
    assert "previous_response_id" not in sent
    assert sent["input"][0]["content"][0]["text"] == "Hello"
    assert sent["input"][-1] == {"type": "message", "role": "user", "content": "And then?"}
    assert [item["type"] for item in sent["input"][1:-1]] == ["reasoning", "message"]


def test_a_whole_message_the_content_filter_cut_is_the_gateways_own_rendering(gateway: str) -> None:
    answer = messages(gateway, {"max_tokens": 5, "messages": [{"role": "user", "content": "filter"}]})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert FORBIDDEN not in answer.text
    assert body["stop_reason"] == "refusal"
