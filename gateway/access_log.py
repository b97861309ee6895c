"""One JSON line per chat request on stdout (`chatgate serve`; `--no-access-log` turns it off).

No message content, never a key: the caller appears by its key's configured name. Written
straight to the stream, not through `logging`: a LogRecord per request measured about 60 µs,
an eighth of a proxied request's CPU.
"""

from __future__ import annotations

import os
import sys
import time
from typing import TextIO

import orjson

from gateway.record import RequestRecord

ENV = "CHATGATE_ACCESS_LOG"  # "1" under `chatgate serve` unless --no-access-log


class AccessLog:
    def __init__(self, stream: TextIO | None) -> None:
        self.stream = stream  # None: off

    @classmethod
    def from_environment(cls) -> AccessLog:
        return cls(sys.stdout if os.environ.get(ENV) == "1" else None)

    def write(self, trace: RequestRecord, seconds: float) -> None:
        if self.stream is None:
            return
        record = {
            "ts": round(time.time(), 3),
            "request_id": trace.request_id,
            "method": trace.method,
            "path": trace.path,
            "dialect": trace.dialect,
            "deployment": trace.deployment,
            "replica": trace.replica,
            "key": trace.key,
            "status": trace.status,
            "latency_ms": round(seconds * 1000, 2),
            "ttft_ms": None if trace.ttft is None else round(trace.ttft * 1000, 2),
            "stream": trace.stream,
            "prompt_tokens": trace.prompt_tokens,
            "completion_tokens": trace.completion_tokens,
            "retries": trace.retries,
            "error": trace.error_code or None,
        }
        self.stream.write(orjson.dumps(record).decode() + "\n")
        self.stream.flush()  # a line at a time, for whoever follows the log
