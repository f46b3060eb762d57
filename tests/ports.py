"""A TCP port for a server a test starts in another process (`free_port`).

Asking the kernel for port 0 and closing the socket hands out a port from the ephemeral range
(Linux 32768–60999, Windows 49152–65535), the range every outgoing connection of every test
also draws its local port from: between the check and the server's bind, another test's
client may take it, and the server fails with "Address already in use" (seen: a second
`serve` process of tests/server/test_shared_limits.py). So ports come from below both
ephemeral ranges, 20000–31999, split between the pytest-xdist workers (1 000 each: `gw0`
20000–20999, `gw1` 21000–21999, …, wrapping after 12), taken in turn within a worker's slice
and checked free by a bind; two workers never draw the same port and no client connection
lands on one.
"""

from __future__ import annotations

import itertools
import os
import random
import socket

_BASE = 20000
_SLICE = 1000
_SLICES = 12


def _slice_start() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    number = int(worker[2:]) if worker[2:].isdigit() else 0
    return _BASE + (number % _SLICES) * _SLICE


_next = itertools.count(random.randrange(_SLICE))


def free_port(host: str = "127.0.0.1") -> int:
    """A port on `host` that nothing listens on now, from this worker's slice.

    Raises:
        OSError: none of the slice's 1 000 ports could be bound.
    """
    start = _slice_start()
    for _ in range(_SLICE):
        port = start + next(_next) % _SLICE
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    raise OSError(f"no free port in {start}-{start + _SLICE - 1} on {host}")
