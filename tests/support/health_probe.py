"""Asks a gateway's /health every 50 ms until its stdin closes, then prints each answer's latency
in seconds (a JSON list) and any failures. Run as its own process (`python -m tests.support.health_probe
URL`): a probe thread inside the pytest process would also time that process's own pauses."""

from __future__ import annotations

import http.client
import sys
import threading
import time
from urllib.parse import urlsplit

import orjson

PROBE_EVERY = 0.05


def main(url: str) -> None:
    address = urlsplit(url)
    stopping = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stopping.set()), daemon=True).start()
    latencies: list[float] = []
    failures: list[str] = []
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=30)
    print("ready", flush=True)
    while not stopping.is_set():
        began = time.perf_counter()
        try:
            connection.request("GET", "/health")
            response = connection.getresponse()
            response.read()
            if response.status != 200:
                failures.append(f"status {response.status}")
        except OSError as error:
            failures.append(repr(error))
            connection.close()
        latencies.append(time.perf_counter() - began)
        stopping.wait(PROBE_EVERY)
    print(orjson.dumps({"latencies": latencies, "failures": failures}).decode(), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
