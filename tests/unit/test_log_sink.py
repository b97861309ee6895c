"""The log writer's thread (gateway/telemetry/log_sink.py) writes every line, in order, and sleeps
while there is none: an idle gateway's writer does not wake."""

from __future__ import annotations

import io
import threading
import time
from pathlib import Path

import pytest

from gateway.telemetry.log_sink import GATHER, LineSink


class Collected(io.StringIO):
    """A stream that says when its text holds a given line."""

    def __init__(self) -> None:
        super().__init__()
        self.changed = threading.Condition()

    def write(self, text: str) -> int:
        with self.changed:
            written = super().write(text)
            self.changed.notify_all()
            return written

    def holds(self, line: str, timeout: float) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: self.getvalue().endswith(line), timeout)


def switches(thread: threading.Thread) -> int:
    """The times `thread` has given up its CPU of its own accord (Linux counts them)."""
    status = Path(f"/proc/self/task/{thread.native_id}/status").read_text()
    counted = next(line for line in status.splitlines() if line.startswith("voluntary_ctxt_switches"))
    return int(counted.split()[1])


pytestmark = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux's /proc")


def test_each_line_arrives_in_order_however_it_meets_the_writer():
    """Lines written one at a time, each waited for, meet the writer at every point of its cycle:
    a wake-up lost between its last look and its wait would leave a line unwritten."""
    stream = Collected()
    sink = LineSink(stream)
    lines = [f"line {n}\n" for n in range(60)]
    for n, line in enumerate(lines):
        if n % 3:
            time.sleep(GATHER * (n % 7) / 5)  # now idle, now gathering, now writing
        sink.write_line(line)
        assert stream.holds(line, timeout=5), f"{line!r} was never written"
    assert stream.getvalue() == "".join(lines)


def test_a_burst_is_written_whole_and_in_order():
    stream = Collected()
    sink = LineSink(stream)
    lines = [f"burst {n}\n" for n in range(2500)]  # more than one batch of 1,000
    for line in lines:
        sink.write_line(line)
    assert stream.holds(lines[-1], timeout=5)
    assert stream.getvalue() == "".join(lines)


def test_an_idle_writer_sleeps_until_a_line_comes():
    stream = Collected()
    sink = LineSink(stream)
    sink.write_line("first\n")
    assert stream.holds("first\n", timeout=5)
    time.sleep(2 * GATHER)  # the writer has gone idle
    before = switches(sink.thread)
    time.sleep(20 * GATHER)
    # a writer that looked every GATHER seconds would have woken about 20 times
    assert switches(sink.thread) - before <= 1
    sink.write_line("second\n")
    assert stream.holds("second\n", timeout=5)
