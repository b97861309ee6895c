"""A deliberately broken OpenAI-dialect endpoint for tests of `chatgate conformance`: every
route answers as the document says, except the chat operation, whose 200 body is malformed."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# No `created`, a `choices` entry without `finish_reason`, and a role no document allows.
MALFORMED_COMPLETION = {
    "id": "chatcmpl-broken",
    "object": "chat.completion",
    "model": "broken",
    "choices": [
        {"index": 0, "message": {"role": "robot", "content": "beep", "refusal": None}, "logprobs": None}
    ],
}
MODEL = {"id": "broken", "object": "model", "created": 1, "owned_by": "tests"}


class BrokenHandler(BaseHTTPRequestHandler):
    def answer(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.send_header("x-request-id", "broken")
        self.end_headers()
        self.wfile.write(data)

    def error(self, status: int, message: str) -> None:
        self.answer(
            status,
            {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": None}},
        )

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        if self.path.split("?")[0] == "/v1/chat/completions":
            self.answer(200, MALFORMED_COMPLETION)
        else:
            self.error(404, "Not found.")

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        if path == "/v1/models":
            self.answer(200, {"object": "list", "data": [MODEL]})
        elif path.startswith("/v1/models/"):
            self.answer(200, MODEL)
        else:
            self.error(404, "Not found.")

    def log_message(self, *_args: object) -> None:  # quiet
        pass


@contextmanager
def broken_endpoint() -> Iterator[str]:
    """Yield the base URL (…/v1) of a broken endpoint served from a thread on loopback."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), BrokenHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
