"""Crash release (architecture.md §3, §10): how long a SIGKILLed holder's lease outlives its holder.

Each repetition starts a holder process that takes a lease through the SDK (`rbroker.lease`)
from a real simulated broker, kills it with SIGKILL once the grant is printed, and times from
the kill until the broker's `lease` event (watched with `events.subscribe`) says the lease
ended. Two ways a holder dies:

- `connection`: the holder's connection closes with it (the common case);
- `shared socket`: the holder forked a child before it was killed, so the connection stays
  open in the child and only the broker's holder check (pid + start time) can free it.

Floor: the operating system's part, from SIGKILL until a process reading a Unix-socket
connection of the killed process sees end-of-file (a bare socket, no broker).

    python bench/crash_release.py [--quick] [--record] [--repeat 50]
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time

from _common import (
    Report,
    fmt_ms,
    fmt_us,
    parser,
    percentile,
    ratio,
    short_tmp,
    start_broker,
    verdict,
)

import rbroker

TARGET_P99_S = 1.0

HOLDER = """
import os, sys, time
import rbroker
sock, mode = sys.argv[1], sys.argv[2]
with rbroker.lease(16, project="bench", session="crash", purpose="crash release benchmark",
                   wait_s=30, socket=sock) as lease:
    child = 0
    if mode == "shared":
        child = os.fork()
        if child == 0:  # keeps the inherited connection open after its parent is killed
            time.sleep(3600)
            os._exit(0)
    print("granted", lease.lease_id, child, flush=True)
    time.sleep(3600)
"""

SOCKET_HOLDER = """
import socket, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
s.sendall(b"ready\\n")
time.sleep(3600)
"""


def crash_once(watcher: rbroker.Client, sock: str, mode: str) -> tuple[float, str]:
    """Start a holder, kill it after its grant; (seconds until the lease ended, end state)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, sock, mode], stdout=subprocess.PIPE, text=True
    )
    child = 0
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().split()
        if len(line) != 3 or line[0] != "granted":
            raise RuntimeError(f"holder did not get its lease: {line}")
        lease_id, child = line[1], int(line[2])
        t0 = time.monotonic()
        os.kill(proc.pid, signal.SIGKILL)
        deadline = t0 + 10
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return float("inf"), "still active after 10 s"
            event = watcher.wait_event(left)
            if event is None or event.get("kind") != "lease":
                continue
            data = event.get("data") or {}
            if data.get("lease_id") == lease_id and data.get("state") != "active":
                return time.monotonic() - t0, str(data.get("state"))
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(5)
        if child:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)


def floor_once(listener: socket.socket, path: str) -> float:
    """Seconds from SIGKILL of a connected process until the reader sees end-of-file."""
    proc = subprocess.Popen([sys.executable, "-c", SOCKET_HOLDER, path])
    conn, _ = listener.accept()
    try:
        conn.recv(16)
        t0 = time.monotonic()
        os.kill(proc.pid, signal.SIGKILL)
        while conn.recv(16):
            pass
        return time.monotonic() - t0
    finally:
        conn.close()
        proc.wait(5)


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, help="kills per way of dying (default 50)")
    args = p.parse_args(argv)
    repeat = args.repeat or (5 if args.quick else 50)

    report = Report("Crash release: a SIGKILLed holder's lease", args.quick)
    path = str(short_tmp() / "floor.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    try:
        floor = [floor_once(listener, path) for _ in range(repeat)]
    finally:
        listener.close()

    times: dict[str, list[float]] = {"connection": [], "shared": []}
    states: dict[str, dict[str, int]] = {"connection": {}, "shared": {}}
    broker = start_broker()
    try:
        with rbroker.Client(broker.socket, timeout_s=30) as watcher:
            watcher.subscribe()
            for _ in range(repeat):  # interleaved, so that load elsewhere hits both alike
                for mode in ("connection", "shared"):
                    t, state = crash_once(watcher, broker.socket, mode)
                    times[mode].append(t)
                    states[mode][state] = states[mode].get(state, 0) + 1
    finally:
        stopped = broker.stop()
        if stopped:
            report.note(stopped)

    f50, f99 = percentile(floor, 50), percentile(floor, 99)
    for mode, label in (
        ("connection", "holder killed, its connection closes"),
        ("shared", "holder killed, its connection stays open in a child"),
    ):
        p50, p99 = percentile(times[mode], 50), percentile(times[mode], 99)
        report.add(
            f"{label}: time until the lease ended, p50",
            fmt_ms(p50) if p50 >= 1e-3 else fmt_us(p50),
            f"socket EOF after SIGKILL {fmt_us(f50)}",
            ratio(p50, f50),
        )
        report.add(
            f"{label}: p99 (max {fmt_ms(max(times[mode]))})",
            fmt_ms(p99),
            f"socket EOF p99 {fmt_us(f99)}",
            ratio(p99, f99),
            "< 1 s",
            verdict(p99 < TARGET_P99_S),
        )
        ends = ", ".join(f"{s} {n}" for s, n in sorted(states[mode].items()))
        report.note(f"{label}: {len(times[mode])} kills; the leases ended as: {ends}.")
    report.note(
        "Timed from just before SIGKILL until the watcher (a client subscribed with "
        "`events.subscribe`) read the `lease` event that ended the lease, so the event's "
        "delivery is included. Holders are separate Python processes using the SDK."
    )
    report.finish(args.record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
