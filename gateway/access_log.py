"""One structured JSON line per request on the `chatgate.access` logger.

No message content, never a key: the caller appears by its key's configured name.
"""

from __future__ import annotations

import logging
import time

import orjson

from gateway.trace import RequestTrace

log = logging.getLogger("chatgate.access")


def log_access(trace: RequestTrace, seconds: float) -> None:
    if not log.isEnabledFor(logging.INFO):
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
    log.info(orjson.dumps(record).decode())
