"""Log lines written by a thread of their own, so a reader that stalls never stalls the gateway.

A line is queued (no waiting: a few hundred nanoseconds); the writer thread takes whatever is
queued and writes it in one go. When the reader of stdout or stderr stops reading, the writer
blocks, the queue fills, and further lines are dropped and counted
(`chatgate_log_lines_dropped_total`) while requests keep flowing. The gateway's own log records
(`logging`) go through the same kind of queue (`DroppingQueueHandler`).
"""

from __future__ import annotations

import logging
import logging.handlers
import queue
import threading
from collections.abc import Callable
from typing import TextIO

CAPACITY = 10_000  # lines held while the reader is away


def no_count() -> None:
    return None


class LineSink:
    def __init__(
        self, stream: TextIO, on_drop: Callable[[], None] = no_count, capacity: int = CAPACITY
    ) -> None:
        self.stream = stream
        self.on_drop = on_drop
        self.lines: queue.SimpleQueue[str] = queue.SimpleQueue()
        self.capacity = capacity
        self.thread = threading.Thread(target=self.drain, name="log-writer", daemon=True)
        self.thread.start()

    def write_line(self, line: str) -> None:
        if self.lines.qsize() >= self.capacity:
            self.on_drop()
            return
        self.lines.put(line)

    def drain(self) -> None:
        while True:
            batch = [self.lines.get()]
            while len(batch) < 1000:
                try:
                    batch.append(self.lines.get_nowait())
                except queue.Empty:
                    break
            try:
                self.stream.write("".join(batch))
                self.stream.flush()
            except (OSError, ValueError):  # the reader is gone for good: keep draining, quietly
                pass


class DroppingQueueHandler(logging.handlers.QueueHandler):
    """logging's QueueHandler on a bounded queue: a full queue drops the record and counts it."""

    def __init__(
        self, target: logging.Handler, on_drop: Callable[[], None] = no_count, capacity: int = CAPACITY
    ) -> None:
        super().__init__(queue.Queue(capacity))
        self.on_drop = on_drop
        self.listener = logging.handlers.QueueListener(self.queue, target, respect_handler_level=True)
        self.listener.start()

    def enqueue(self, record: logging.LogRecord) -> None:
        try:
            self.queue.put_nowait(record)
        except queue.Full:
            self.on_drop()


def without_blocking(
    loggers: list[logging.Logger], on_drop: Callable[[], None], capacity: int = CAPACITY
) -> list[DroppingQueueHandler]:
    """Put each handler of these loggers behind a bounded queue and a thread of its own."""
    queued = []
    for logger in loggers:
        handlers = list(logger.handlers)
        for handler in handlers:
            logger.removeHandler(handler)
            wrapped = DroppingQueueHandler(handler, on_drop, capacity)
            logger.addHandler(wrapped)
            queued.append(wrapped)
    return queued
