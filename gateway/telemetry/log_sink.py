"""Log lines written by a thread of their own, so a reader that stalls never stalls the gateway.

A line is queued (no waiting: well under a microsecond); the writer thread wakes with the first
line after it has been idle, lets the lines of the next 20 ms gather, and writes them in one go.
An idle gateway's writer sleeps until there is a line. When the reader of stdout or stderr stops
reading, the writer blocks, the queue fills, and further lines are dropped and counted
(`chatgate_log_lines_dropped_total`) while requests keep flowing. The gateway's own log records
(`logging`) go through the same kind of queue (`DroppingQueueHandler`).
"""

from __future__ import annotations

import collections
import logging
import logging.handlers
import queue
import threading
import time
from collections.abc import Callable
from typing import TextIO

CAPACITY = 10_000  # lines held while the reader is away
GATHER = 0.02  # seconds the writer lets lines gather once one has woken it


def no_count() -> None:
    return None


class LineSink:
    def __init__(
        self, stream: TextIO, on_drop: Callable[[], None] = no_count, capacity: int = CAPACITY
    ) -> None:
        self.stream = stream
        self.on_drop = on_drop
        # a deque's append is atomic and wakes no one; only a line that finds the writer idle
        # wakes it, so a busy gateway wakes it at most once every GATHER seconds (a queue that
        # woke the writer per line cost about 9 µs a request)
        self.lines: collections.deque[str] = collections.deque()
        self.capacity = capacity
        self.idle = False  # the writer waits for `wake` (or is about to)
        self.wake = threading.Event()
        self.thread = threading.Thread(target=self.drain, name="log-writer", daemon=True)
        self.thread.start()

    def write_line(self, line: str) -> None:
        if len(self.lines) >= self.capacity:
            self.on_drop()
            return
        self.lines.append(line)
        if self.idle:
            self.idle = False
            self.wake.set()

    def drain(self) -> None:
        lines = self.lines
        while True:
            if not lines:
                # idle first, then look again: a line appended in between either is seen here or
                # finds `idle` set and wakes the wait below
                self.idle = True
                if not lines:
                    self.wake.wait()
                self.idle = False
                self.wake.clear()
                time.sleep(GATHER)
                continue
            batch = [lines.popleft() for _ in range(min(len(lines), 1000))]
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
