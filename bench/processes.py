"""Servers under test as child processes: start, wait until ready, read their RSS and CPU time, stop."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.connections import connections_by_worker

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
START_TIMEOUT = 60.0


class StartError(RuntimeError):
    """A server that exited or never became ready; the message ends with its log."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def accepts_connections(port: int) -> Callable[[], bool]:
    def ready() -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            return False

    return ready


def answers_health(port: int) -> Callable[[], bool]:
    def ready() -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    return ready


def pinned(cores: str | None, command: list[str]) -> list[str]:
    """`command` run on the given CPUs (taskset execs, so the child's pid is the server's)."""
    return command if cores is None else ["taskset", "-c", cores, *command]


@dataclass
class Server:
    name: str
    port: int
    process: subprocess.Popen
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def rss_bytes(self) -> int:
        """VmRSS of the server process itself (not its children)."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError(f"{self.name}: no VmRSS in /proc/{self.process.pid}/status")

    def cpu_seconds(self) -> float:
        """User + system CPU time of the process and its live descendants (workers)."""
        return sum(self.cpu_by_process().values())

    def cpu_by_process(self) -> dict[int, float]:
        return {pid: process_cpu_seconds(pid) for pid in process_tree(self.process.pid)}

    def connections_by_worker(self) -> list[int]:
        """Established connections held by each worker: the descendants that listen on the port
        (not the supervisor, which keeps the workers' listening sockets too)."""
        return connections_by_worker(process_tree(self.process.pid)[1:], self.port)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_server(
    name: str,
    command: list[str],
    port: int,
    log: Path,
    ready: Callable[[], bool],
    cwd: Path,
    env: dict[str, str] | None = None,
    timeout: float = START_TIMEOUT,
) -> Server:
    with log.open("wb") as sink:
        process = subprocess.Popen(
            command,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    server = Server(name, port, process, log)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise StartError(f"{name} exited with {process.returncode}:\n{server.log_tail()}")
        if ready():
            return server
        time.sleep(0.1)
    server.stop()
    raise StartError(f"{name} was not ready after {timeout:.0f} s:\n{server.log_tail()}")


def process_tree(pid: int) -> list[int]:
    pids, pending = [], [pid]
    while pending:
        current = pending.pop()
        pids.append(current)
        try:
            tasks = os.listdir(f"/proc/{current}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                children = Path(f"/proc/{current}/task/{task}/children").read_text().split()
            except OSError:
                continue
            pending.extend(int(child) for child in children)
    return pids


def process_cpu_seconds(pid: int) -> float:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)": state is field 3
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of proc(5)
    return (utime + stime) / CLOCK_TICKS


def busy_share(seconds: float = 1.0) -> float:
    """The share of all CPUs busy over `seconds` (other work on the machine makes figures noisy)."""

    def sample() -> tuple[int, int]:
        values = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = values[3] + values[4]  # idle + iowait
        return sum(values[:8]), idle

    total, idle = sample()
    time.sleep(seconds)
    total_after, idle_after = sample()
    elapsed = total_after - total
    return 1 - (idle_after - idle) / elapsed if elapsed else 0.0
