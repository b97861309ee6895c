"""An OpenAI-compatible upstream whose streams stop just short of their end: the path
`/held-<N>/v1/chat/completions` streams a role chunk and N one-word chunks, then holds the
stream open (no finish, no usage) until the gateway hangs up. It counts the requests it is
answering, so a test can wait until every hang-up has reached it."""

from __future__ import annotations

import asyncio
from collections import Counter

from tests.support.fault_upstream import chunk, send_chunk, start_stream
from tests.support.loopback_server import LoopbackServer


class HeldUpstream(LoopbackServer):
    thread_name = "held-upstream"

    def __init__(self) -> None:
        super().__init__()
        self.answering: Counter[str] = Counter()
        self.answered: Counter[str] = Counter()

    def base_url(self, chunks: int) -> str:
        return f"{self.url}/held-{chunks}/v1"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self.tasks.add(task)
        behaviour, counted = "", False
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            line, *header_lines = head.decode("latin-1").split("\r\n")
            behaviour = line.split(" ")[1].strip("/").split("/")[0]
            headers = {
                k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines if h)
            }
            await reader.readexactly(int(headers.get("content-length", "0")))
            self.answering[behaviour] += 1
            self.answered[behaviour] += 1
            counted = True
            await start_stream(writer)
            await send_chunk(writer, chunk({"role": "assistant", "content": ""}))
            for index in range(int(behaviour.removeprefix("held-"))):
                await send_chunk(writer, chunk({"content": f" w{index}"}))
            await reader.read(1)  # held open: silence until the gateway hangs up
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            if counted:
                self.answering[behaviour] -= 1
            writer.close()
            self.tasks.discard(task)
