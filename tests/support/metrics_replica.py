"""A stand-in for one vLLM or llama.cpp server replica: it answers chat completions (plainly,
or after `slow_ms`) and publishes /metrics in that server's own text format, with the load the
test sets; `metrics_answer = False` makes its /metrics stop answering (it holds the connection
and says nothing), as a wedged or firewalled metrics port does."""

from __future__ import annotations

import asyncio
from typing import Literal

import orjson

from tests.support.fault_upstream import COMPLETION, respond
from tests.support.loopback_server import LoopbackServer, read_request

Format = Literal["vllm", "llamacpp"]


def metrics_text(kind: Format, running: float, waiting: float, kv_cache: float = 0.0) -> str:
    """The page as each server writes it (names, types, labels: the real-servers audit)."""
    if kind == "vllm":
        labels = '{engine="0",model_name="m"}'
        return (
            "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
            "# TYPE vllm:num_requests_running gauge\n"
            f"vllm:num_requests_running{labels} {float(running)}\n"
            "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
            "# TYPE vllm:num_requests_waiting gauge\n"
            f"vllm:num_requests_waiting{labels} {float(waiting)}\n"
            "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n"
            "# TYPE vllm:kv_cache_usage_perc gauge\n"
            f"vllm:kv_cache_usage_perc{labels} {float(kv_cache)}\n"
            "# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.\n"
            "# TYPE vllm:prefix_cache_hits_total counter\n"
            f"vllm:prefix_cache_hits_total{labels} 0.0\n"
        )
    return (
        "# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.\n"
        "# TYPE llamacpp:prompt_tokens_total counter\n"
        "llamacpp:prompt_tokens_total 0\n"
        "# HELP llamacpp:requests_processing Number of requests processing.\n"
        "# TYPE llamacpp:requests_processing gauge\n"
        f"llamacpp:requests_processing {int(running)}\n"
        "# HELP llamacpp:requests_deferred Number of requests deferred.\n"
        "# TYPE llamacpp:requests_deferred gauge\n"
        f"llamacpp:requests_deferred {int(waiting)}\n"
    )


class MetricsReplica(LoopbackServer):
    thread_name = "metrics-replica"

    def __init__(self, kind: Format) -> None:
        super().__init__()
        self.kind: Format = kind
        self.running = 0.0
        self.waiting = 0.0
        self.kv_cache = 0.0
        self.metrics_answer = True
        self.served = 0  # chat completions answered
        self.scraped = 0  # /metrics answered
        self.slow_ms = 0

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def say(self, running: float, waiting: float = 0, kv_cache: float = 0) -> None:
        self.running, self.waiting, self.kv_cache = running, waiting, kv_cache

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self.tasks.add(task)  # type: ignore[arg-type]
        try:
            while True:
                method, target, _headers, body = await read_request(reader)
                if target == "/metrics":
                    if not self.metrics_answer:
                        await reader.read(1)  # silence until the reader gives up
                        return
                    self.scraped += 1
                    page = metrics_text(self.kind, self.running, self.waiting, self.kv_cache).encode()
                    writer.write(
                        b"HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\n"
                        + f"content-length: {len(page)}\r\n\r\n".encode()
                        + page
                    )
                    await writer.drain()
                elif method == "POST" and target.endswith("/chat/completions"):
                    self.served += 1
                    if self.slow_ms:
                        await asyncio.sleep(self.slow_ms / 1000)
                    assert not orjson.loads(body).get("stream")
                    await respond(writer, 200, orjson.dumps(COMPLETION))
                else:
                    await respond(writer, 404, b"{}")
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            self.tasks.discard(task)  # type: ignore[arg-type]
