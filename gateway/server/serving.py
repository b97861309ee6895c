"""Running the gateway: one uvicorn server, or N worker processes each with its own
SO_REUSEPORT socket (the kernel spreads connections over them), and the way it stops.

SIGTERM (or Ctrl-C) drains: /ready answers 503 at once, new connections are still served for
`server.shutdown.drain` seconds, then the listener closes; requests and streams in flight get
`server.shutdown.deadline` seconds more, then the process exits 0. A worker that fails while
starting stops the whole gateway with its one-line reason; one that dies later is replaced.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import logging.config
import multiprocessing
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn

from gateway.config.environment import METRICS_DIR
from gateway.config.settings import ClientLimits, ConfigError, Settings
from gateway.config.source import Source
from gateway.config.watch import ConfigWatch
from gateway.http.lifecycle import Lifecycle
from gateway.policy.stores import split_between_workers

log = logging.getLogger("chatgate")
STARTUP_FAILURE = 3  # a worker's exit code when it could not start (uvicorn's own convention)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
RESTART_PAUSE = 1.0  # seconds before replacing a worker that died, so a crash loop cannot spin
WATCH_SECONDS = 2.0  # how often the config and keys files are looked at for changes
LEAST_BACKLOG = 2048  # uvicorn's own listen backlog
SOMAXCONN = Path("/proc/sys/net/core/somaxconn")  # Linux's cap on any listen backlog


class StartupError(Exception):
    """The gateway cannot start; the message says why in one line."""


@dataclass(frozen=True, slots=True)
class ServeOptions:
    """What `chatgate serve` decided: the settings and how to run them."""

    settings: Settings
    host: str
    port: int
    workers: int
    log_level: str
    access_log: bool
    log_config: dict[str, Any]
    config_path: Path | None = None  # reloaded on SIGHUP or when it changes
    source: Source | None = None  # the files the settings came from, as read


def bind(host: str, port: int, reuse_port: bool) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        reason = "in use by another process" if error.errno == 98 else (error.strerror or str(error))
        raise StartupError(f"cannot listen on {host}:{port}: {reason}") from None
    sock.set_inheritable(True)
    return sock


def serve(options: ServeOptions) -> int:
    """Serve until stopped; the process's exit code."""
    if (split := split_between_workers(options.settings, options.workers)) is not None:
        raise StartupError(split)
    if options.workers == 1:
        sock = bind(options.host, options.port, reuse_port=False)
        code = run_worker(options, sock)
        return 2 if code == STARTUP_FAILURE else code
    # One socket per worker on the same port: the kernel balances new connections between
    # them (one shared socket leaves it to whichever worker wakes first).
    sockets = [bind(options.host, options.port, reuse_port=True) for _ in range(options.workers)]
    return Supervisor(options, sockets).run()


class GatewayServer(uvicorn.Server):
    """uvicorn's server with the gateway's way of stopping (see the module docstring) and of
    taking a new config: SIGHUP, or a change to the config or keys file, reloads it
    (gateway/config/watch.py: checked first; a refused file is logged once, the running config
    stays)."""

    def __init__(self, config: uvicorn.Config, lifecycle: Lifecycle, options: ServeOptions) -> None:
        super().__init__(config)
        self.lifecycle = lifecycle
        self.settings = options.settings
        self.workers = options.workers
        self.drain = self.settings.server.shutdown.drain
        self.drain_ends: float | None = None
        self.watch = ConfigWatch(options.settings, options.source, log, options.config_path)
        self.reload_asked = False
        self.watched_at = time.monotonic()
        self.reloading: asyncio.Task[None] | None = None
        self.supervisor: int | None = None  # a worker's supervisor: when it is gone, stop too

    def ask_reload(self, sig: int, frame: Any) -> None:
        self.reload_asked = True

    async def reload(self, why: str) -> None:
        running = self.watch.settings, self.watch.source
        # read, parsed and validated in a thread: a keys file of 20,000 keys takes seconds of
        # YAML, and the loop keeps answering meanwhile (one reload at a time: on_tick)
        settings = await asyncio.to_thread(self.watch.take, why)
        if settings is None:
            return
        if (split := split_between_workers(settings, self.workers)) is not None:
            log.error("%s: refused, the running config stays: %s", why, split)
            self.watch.settings, self.watch.source = running
            return
        if (settings.server, settings.mounts) != (self.settings.server, self.settings.mounts):
            log.warning("%s: server and mounts settings change only with a restart", why)
        await self.lifecycle.reload(settings)
        self.settings = settings
        log.info(
            "%s: reloaded %s (%d deployments, %d keys)",
            why, self.watch.config_path, len(settings.deployments), len(settings.keys),
        )  # fmt: skip
        if settings.keyed and not settings.keys:
            log.warning("no keys left: every request that needs a key is refused (401)")

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # uvicorn re-raises a caught SIGTERM once it has stopped, so the process ends "killed by
        # SIGTERM" (143); a drained, finished gateway exits 0 instead.
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.stop) for sig in STOP_SIGNALS}
        previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, self.ask_reload)
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def stop(self, sig: int, frame: Any) -> None:
        if self.drain_ends is not None:
            if sig == signal.SIGINT:  # a second Ctrl-C: stop now
                self.force_exit = True
            return
        self.lifecycle.draining = True
        self.drain_ends = time.monotonic() + self.drain
        log.info(
            "%s: draining for %gs, then finishing requests in flight", signal.Signals(sig).name, self.drain
        )

    async def on_tick(self, counter: int) -> bool:
        now = time.monotonic()
        if self.drain_ends is not None and now >= self.drain_ends:
            return True
        if self.supervisor is not None and self.drain_ends is None and os.getppid() != self.supervisor:
            # the supervisor was killed (SIGKILL, the OOM killer): no worker may go on serving
            # the port alone, unsupervised and unstoppable by the process manager
            self.stop(signal.SIGTERM, None)
        why = None
        if self.reload_asked:
            self.reload_asked, why = False, "SIGHUP"
        elif now - self.watched_at >= WATCH_SECONDS:
            self.watched_at = now
            if self.watch.due():
                why = "config changed"
        if why is not None and (self.reloading is None or self.reloading.done()):
            self.reloading = asyncio.get_running_loop().create_task(self.reload(why))
        return await super().on_tick(counter)


def listen_backlog(limits: ClientLimits) -> int:
    """Connections the kernel queues for a worker before it accepts them: as many as it takes.

    uvicorn's 2,048 is less than a burst of `max_connections` new streams: with a busy event loop
    the queue overflowed and the kernel reset the connections it could not queue (8,000 streams
    opened over a second: 840 of them "connection reset by peer")."""
    wanted = max(LEAST_BACKLOG, limits.max_connections + limits.probe_connections)
    with contextlib.suppress(OSError, ValueError):
        cap = int(SOMAXCONN.read_text())
        if cap < wanted:
            log.warning(
                "the kernel queues at most %d connections waiting to be accepted (net.core.somaxconn); "
                "server.clients.max_connections asks for %d: raise it, or a burst of new connections "
                "may be reset",
                cap,
                wanted,
            )
    return wanted


def run_worker(options: ServeOptions, sock: socket.socket, supervisor: int | None = None) -> int:
    """One server process on a bound socket (in the process itself, or in a worker)."""
    from gateway.app import build_gateway
    from gateway.server.edge import Connections, EdgeProtocol
    from gateway.server.edge_writing import limit_unsent
    from gateway.telemetry.access_log import AccessLog
    from gateway.telemetry.log_sink import without_blocking

    logging.config.dictConfig(options.log_config)
    lifecycle = Lifecycle()
    settings = options.settings
    access_log = AccessLog.to(sys.stdout if options.access_log else None, settings.server.log_buffer_lines)
    try:
        gateway = build_gateway(settings, access_log, lifecycle)
    except ConfigError as error:
        print(f"chatgate: {error}", file=sys.stderr, flush=True)
        return STARTUP_FAILURE
    # no log line may wait on its reader: a stalled stdout or stderr drops lines, counted
    dropped = gateway.metrics.log_line_dropped
    if access_log.sink is not None:
        access_log.sink.on_drop = dropped
    loggers = [logging.getLogger(name) for name in ("", "uvicorn", "uvicorn.error", "uvicorn.access")]
    without_blocking(loggers, dropped, settings.server.log_buffer_lines)
    edge = functools.partial(
        EdgeProtocol,
        limits=settings.server.clients,
        max_body_bytes=settings.server.max_body_bytes,
        render_error=gateway.error_dialects.edge_error,
        shared=Connections(),
    )
    limit_unsent(sock, settings.server.clients)
    config = uvicorn.Config(
        gateway.app,
        log_config=None,  # configured above, once
        log_level=options.log_level,
        access_log=False,
        # nothing reads the client's address or scheme: no X-Forwarded-* rewriting per request
        proxy_headers=False,
        ws="none",  # no WebSocket routes: its library is not even imported (a few MB of RSS)
        loop="uvloop",
        http=edge,  # type: ignore[arg-type]
        backlog=listen_backlog(settings.server.clients),
        lifespan="on",
        # seconds (a float works; 0 must not read as None, "wait forever")
        timeout_graceful_shutdown=max(settings.server.shutdown.deadline, 0.001),  # type: ignore[arg-type]
    )
    server = GatewayServer(config, lifecycle, options)
    server.supervisor = supervisor
    host, port = sock.getsockname()[:2]
    log.info("chatgate serving on http://%s:%d (process %d)", host, port, os.getpid())
    if settings.keyed and not settings.keys:
        log.warning("no keys configured: every request that needs a key is refused (401)")
    try:
        server.run(sockets=[sock])
    except SystemExit as exit:  # uvicorn's own way out when the app's startup fails
        return STARTUP_FAILURE if exit.code == STARTUP_FAILURE else int(exit.code or 0)
    return 0 if server.started else STARTUP_FAILURE


def worker_main(options: ServeOptions, sock: socket.socket, supervisor: int) -> None:
    """A worker process's entry point."""
    sys.exit(run_worker(options, sock, supervisor))


class Supervisor:
    """Starts the workers, replaces one that dies, passes SIGTERM on and waits for them."""

    def __init__(self, options: ServeOptions, sockets: list[socket.socket]) -> None:
        self.options = options
        self.sockets = sockets
        self.context = multiprocessing.get_context("spawn")
        self.processes: list[Any] = []
        self.stopping = threading.Event()
        # the settings a worker started now gets: the files as they are, not as they were at start
        self.watch = ConfigWatch(options.settings, options.source, None, options.config_path)
        self.reload_asked = False

    def start(self, index: int) -> Any:
        process = self.context.Process(
            target=worker_main,
            args=(self.options, self.sockets[index], os.getpid()),
            name=f"chatgate-worker-{index}",
        )
        process.start()
        return process

    def run(self) -> int:
        from prometheus_client import multiprocess

        # prometheus_client adds up the workers' metrics through files in one folder, which it
        # finds in the environment: set here (the one write), the spawned workers inherit it
        settings = self.options.settings
        metrics_dir = settings.environment.metrics_dir
        own_dir = metrics_dir is None
        if own_dir:
            metrics_dir = os.environ[METRICS_DIR] = tempfile.mkdtemp(prefix="chatgate-metrics-")
            environment = dataclasses.replace(settings.environment, metrics_dir=metrics_dir)
            self.options = dataclasses.replace(self.options, settings=settings.in_environment(environment))
        for sig in STOP_SIGNALS:
            signal.signal(sig, lambda *_: self.stopping.set())
        signal.signal(signal.SIGHUP, self.pass_on_sighup)
        try:
            self.processes = [self.start(i) for i in range(len(self.sockets))]
            watched_at = time.monotonic()
            while not self.stopping.wait(0.2):
                if self.reload_asked or time.monotonic() - watched_at >= WATCH_SECONDS:
                    self.follow_files()
                    watched_at = time.monotonic()
                for index, process in enumerate(self.processes):
                    if process.is_alive():
                        continue
                    multiprocess.mark_process_dead(process.pid)
                    if process.exitcode == STARTUP_FAILURE:
                        log.error("a worker could not start; stopping")
                        self.stop_all()
                        return 2
                    log.warning("worker %d exited (%s); starting another", process.pid, process.exitcode)
                    time.sleep(RESTART_PAUSE)
                    self.processes[index] = self.start(index)
            self.stop_all()
            return 0
        finally:
            for sock in self.sockets:
                sock.close()
            if own_dir and metrics_dir is not None:
                shutil.rmtree(metrics_dir, ignore_errors=True)
                os.environ.pop(METRICS_DIR, None)

    def follow_files(self) -> None:
        """Keep the settings a new worker gets as the workers keep theirs (each worker reloads on
        its own and says so; the supervisor only follows)."""
        asked, self.reload_asked = self.reload_asked, False
        running = self.watch.settings, self.watch.source
        if (asked or self.watch.due()) and (settings := self.watch.take("supervisor")) is not None:
            if split_between_workers(settings, len(self.sockets)) is not None:
                self.watch.settings, self.watch.source = running  # its workers refuse it too
                return
            self.options = dataclasses.replace(self.options, settings=settings, source=self.watch.source)

    def pass_on_sighup(self, sig: int, frame: Any) -> None:
        """Each worker reloads on its own (each holds its own runtime)."""
        self.reload_asked = True
        for process in self.processes:
            if process.is_alive() and process.pid is not None:
                os.kill(process.pid, signal.SIGHUP)

    def stop_all(self) -> None:
        """SIGTERM to every worker; each drains and finishes on its own clock, then exits."""
        shutdown = self.options.settings.server.shutdown
        for process in self.processes:
            if process.is_alive():
                process.terminate()
        ends = time.monotonic() + shutdown.drain + shutdown.deadline + 5
        for process in self.processes:
            process.join(max(0.0, ends - time.monotonic()))
            if process.is_alive():
                process.kill()
                process.join()
