"""The upstream every contender talks to: nginx serving a fixed chat.completion and a fixed
64-chunk SSE stream, from a config generated in a temporary directory (no root paths).

`POST /v1/chat/completions` answers the JSON body; `POST /stream/v1/chat/completions` answers
the stream (so a gateway deployment whose base_url ends in /stream/v1 gets streams). nginx's
static module refuses POST with 405; `error_page 405 =200 $uri` serves the file anyway.
"""

from __future__ import annotations

from pathlib import Path

import orjson

MODEL = "bench"
STREAM_CHUNKS = 64  # data events before [DONE]: role, 61 content pieces, finish, usage
REQUEST = {
    "model": MODEL,
    "messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Say something about Lisbon in a few words."},
    ],
    "max_tokens": 64,
}
STREAM_REQUEST = {**REQUEST, "model": MODEL + "-stream", "stream": True}
WORDS = [f"word{i} " for i in range(STREAM_CHUNKS - 3)]
USAGE = {"prompt_tokens": 24, "completion_tokens": len(WORDS), "total_tokens": 24 + len(WORDS)}
CREATED = 1763780000


def completion_body() -> bytes:
    return orjson.dumps(
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "created": CREATED,
            "model": MODEL,
            "system_fingerprint": None,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "".join(WORDS).strip()},
                    "logprobs": None,
                    "finish_reason": "stop",
                }
            ],
            "usage": USAGE,
        }
    )


def stream_body() -> bytes:
    def chunk(delta: dict, finish_reason: str | None = None, usage: dict | None = None) -> bytes:
        choices = [] if usage else [
            {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        ]  # fmt: skip
        payload = {
            "id": "chatcmpl-bench",
            "object": "chat.completion.chunk",
            "created": CREATED,
            "model": MODEL,
            "system_fingerprint": None,
            "choices": choices,
        }
        if usage:
            payload["usage"] = usage
        return b"data: " + orjson.dumps(payload) + b"\n\n"

    events = [chunk({"role": "assistant", "content": ""})]
    events += [chunk({"content": word}) for word in WORDS]
    events += [chunk({}, "stop"), chunk({}, usage=USAGE)]
    assert len(events) == STREAM_CHUNKS
    return b"".join(events) + b"data: [DONE]\n\n"


NGINX_CONF = """\
daemon off;
worker_processes 1;
pid {tmp}/nginx-{port}.pid;
error_log {tmp}/nginx-{port}.error.log warn;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/client_body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    keepalive_requests 100000000;
    keepalive_timeout 300s;
    etag off;
    server {{
        listen 127.0.0.1:{port};
        location = /v1/chat/completions {{
            default_type application/json;
            alias {tmp}/completion.json;
            error_page 405 =200 $uri;
        }}
        location = /stream/v1/chat/completions {{
            default_type text/event-stream;
            add_header Cache-Control no-cache;
            alias {tmp}/stream.sse;
            error_page 405 =200 $uri;
        }}
        location = /v1/traces {{  # an OTLP/HTTP collector that keeps nothing
            return 200;
        }}
    }}
}}
"""


def write_nginx_files(tmp: Path, port: int) -> Path:
    """The bodies (shared by every instance) and this port's config; returns the config path."""
    tmp.chmod(0o755)  # started as root, nginx reads the files as an unprivileged worker user
    (tmp / "completion.json").write_bytes(completion_body())
    (tmp / "stream.sse").write_bytes(stream_body())
    conf = tmp / f"nginx-{port}.conf"
    conf.write_text(NGINX_CONF.format(tmp=tmp, port=port))
    return conf


def nginx_command(tmp: Path, conf: Path) -> list[str]:
    # -e: the error log before the config is read (else nginx opens /var/log/nginx/error.log)
    return ["nginx", "-p", str(tmp), "-e", str(tmp / "nginx-startup.error.log"), "-c", str(conf)]
