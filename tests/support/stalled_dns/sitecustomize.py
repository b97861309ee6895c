"""Loaded by a gateway process started with this folder on PYTHONPATH: its name lookups behave as
a resolver whose DNS never answers for names under `slow.test` (the lookup blocks its thread, as
glibc's does, here for STALL seconds), and `up.test` names loopback. Every other name is looked
up as usual."""

from __future__ import annotations

import socket
import time

STALL = 30.0
real_getaddrinfo = socket.getaddrinfo


def getaddrinfo(host, port, *args, **kwargs):  # type: ignore[no-untyped-def]
    name = host.decode() if isinstance(host, bytes) else host
    if isinstance(name, str) and name.endswith(".slow.test"):
        time.sleep(STALL)
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
    if name == "up.test":
        host = "127.0.0.1"
    return real_getaddrinfo(host, port, *args, **kwargs)


socket.getaddrinfo = getaddrinfo
