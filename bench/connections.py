"""Which worker holds which connections: established TCP connections on a port, per process.

A process's sockets are the `socket:[inode]` links in /proc/<pid>/fd; the kernel's TCP tables
(/proc/net/tcp and tcp6) give each socket's local port, state and inode. A worker is a process
that holds a listening socket on the port (with SO_REUSEPORT each worker has its own).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

TCP_TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))
ESTABLISHED = "01"
LISTEN = "0A"


def socket_inodes_on_port(port: int, state: str) -> set[int]:
    """Inodes of the sockets whose local port is `port`, in the given TCP state (hex, as in proc(5))."""
    inodes = set()
    for table in TCP_TABLES:
        try:
            rows = table.read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            local, found_state, inode = fields[1], fields[3], int(fields[9])
            if found_state == state and int(local.rsplit(":", 1)[1], 16) == port:
                inodes.add(inode)
    return inodes


def socket_inodes_of(pid: int) -> set[int]:
    """Inodes of the sockets process `pid` has open (none if it is gone)."""
    folder = f"/proc/{pid}/fd"
    try:
        names = os.listdir(folder)
    except OSError:
        return set()
    inodes = set()
    for name in names:
        try:
            target = os.readlink(f"{folder}/{name}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[len("socket:[") : -1]))
    return inodes


def connections_by_worker(pids: Iterable[int], port: int) -> list[int]:
    """Established connections on `port` held by each of `pids` that listens on it, in pid order."""
    listening = socket_inodes_on_port(port, LISTEN)
    established = socket_inodes_on_port(port, ESTABLISHED)
    counts = []
    for pid in sorted(pids):
        owned = socket_inodes_of(pid)
        if owned & listening:
            counts.append(len(owned & established))
    return counts
