"""Lease cycle over this OS's own transport beside an echo floor on the same transport: the
named pipe on Windows (rbroker.transport.pipe_windows), the Unix socket elsewhere.

Measures, in one run on one machine, one client:
- the figure: `lease.acquire` + `lease.renew` + `lease.release` through `rbroker.Client`
  against a real simulated broker process listening at its address (a named pipe on
  Windows), the renewal pipelined as the SDK's heartbeat sends it (`Client.call_nowait`);
- the floor: the same three requests as bare JSON-line round trips to an echo server in its
  own process, served by the broker's transport code (`rbroker.transport.serve`: on Windows
  the same pipe instances, access list and proactor transport) on the broker's event loop
  (`rbroker.base.eventloop`), from a client on `rbroker.transport.connect` (the stream
  `rbroker.Client` reads its answers from).

bench/lease_cycle.py is the Unix figure with its 50-client and Redis rows; this one exists so
that the Windows pipe is measured the same way (under Wine on Linux its ratio is evidence
about the code's own cost beside the pipe's, not a promise about Windows).

    python bench/transport_cycle.py [--quick] [--record] [--cycles 2000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import (
    Report,
    fmt_us,
    fmt_x,
    interleaved,
    median,
    parser,
    per_round,
    percentile,
    short_tmp,
    spread,
    start_broker,
    verdict,
)

import rbroker
from rbroker import transport
from rbroker.base import eventloop
from rbroker.base.children import spawn
from rbroker.demo.processes import broker_address
from rbroker.transport.base import PeerOf

ACQUIRE: dict[str, Any] = {
    "mib": 64,
    "project": "bench",
    "purpose": "lease cycle benchmark",
    "session": "transport-cycle",
    "ttl_s": 30.0,
    "wait_s": 30.0,
}
LEASE_ID = "lease-0123456789ab"
LINE_LIMIT = 64 * 1024
TARGET_P50_ECHO = 1.5  # 1-client p50 ≤ 1.5× the echo floor's (architecture.md §10)


# ---------------------------------------------------------------- the floor: a bare echo


class Echo(asyncio.Protocol):
    """Answers each JSON-RPC line with its params as the result, as the broker's connection
    reads its lines: in `data_received`, written with `transport.write`."""

    def __init__(self, peer_of: PeerOf) -> None:
        self._peer_of = peer_of
        self._buf = bytearray()
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self._peer_of(transport)  # who connected, as the broker asks the OS once per client

    def data_received(self, data: bytes) -> None:
        self._buf += data
        while (end := self._buf.find(b"\n")) >= 0:
            msg = json.loads(self._buf[:end])
            del self._buf[: end + 1]
            out = {"jsonrpc": "2.0", "id": msg.get("id"), "result": msg.get("params")}
            assert self._transport is not None
            self._transport.write(json.dumps(out, separators=(",", ":")).encode() + b"\n")


async def _serve_echo(address: str) -> None:
    server = await transport.serve(address, lambda peer_of, _limit: Echo(peer_of), LINE_LIMIT)
    try:
        await asyncio.Event().wait()  # until the process is ended
    finally:
        await server.close()


class LineClient:
    """A blocking JSON-line client on `rbroker.transport.connect`, minus RPC."""

    def __init__(self, address: str) -> None:
        self.stream = transport.connect(address, 60.0)
        self.ids = 0

    def call(self, method: str, **params: Any) -> Any:
        self.ids += 1
        msg = {"jsonrpc": "2.0", "id": self.ids, "method": method, "params": params}
        self.stream.write(
            json.dumps(msg, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"
        )
        return json.loads(self.stream.readline())["result"]

    def close(self) -> None:
        self.stream.close()


def start_echo(root: Path) -> tuple[subprocess.Popen[bytes], str]:
    """The echo server in its own process (this script with `--echo-at`), ended with this
    one; returns (process, address) once it answers.

    Raises:
        RuntimeError: it exited or did not answer within 20 s.
    """
    address = broker_address(root, "echo")
    with open(root / "echo.log", "ab") as log:
        proc = spawn(
            [sys.executable, str(Path(__file__).resolve()), "--echo-at", address],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            LineClient(address).close()
            return proc, address
        except OSError:
            time.sleep(0.05)
    proc.kill()
    log_text = (root / "echo.log").read_text(errors="replace")
    raise RuntimeError(f"the echo server did not answer at {address}:\n{log_text}")


# ---------------------------------------------------------------- the two kinds of cycle


def cycle_fn(kind: str, conn: Any) -> Callable[[], None]:
    """One cycle of `kind` ("broker" or "echo") on `conn`."""
    if kind == "broker":

        def broker_cycle() -> None:
            lid = conn.call("lease.acquire", **ACQUIRE)["lease"]["lease_id"]
            conn.call_nowait("lease.renew", lease_id=lid)  # pipelined, as the SDK renews
            conn.call("lease.release", lease_id=lid)

        return broker_cycle

    def echo_cycle() -> None:
        conn.call("lease.acquire", **ACQUIRE)
        conn.call("lease.renew", lease_id=LEASE_ID)
        conn.call("lease.release", lease_id=LEASE_ID)

    return echo_cycle


def latencies(
    address: dict[str, str], n: int, warmup: int, slices: int = 10
) -> dict[str, list[float]]:
    """Durations (s) of `n` cycles by one client of each kind, after `warmup` untimed ones;
    the kinds (in the order of `address`) take turns in `slices` slices, so that load
    elsewhere hits them alike."""
    conns = {
        "broker": rbroker.Client(address["broker"], timeout_s=60),
        "echo": LineClient(address["echo"]),
    }
    try:
        return interleaved(
            {kind: cycle_fn(kind, conns[kind]) for kind in address}, n, warmup, slices
        )
    finally:
        for conn in conns.values():
            conn.close()


def wine_version() -> str | None:
    """Wine's version when this Windows process runs under Wine, else None."""
    if sys.platform != "win32":
        return None
    import ctypes

    try:
        get = ctypes.WinDLL("ntdll").wine_get_version
    except (OSError, AttributeError):
        return None
    get.restype = ctypes.c_char_p
    return str(get().decode())


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--cycles", type=int, help="timed cycles of each kind per round (2000)")
    p.add_argument("--warmup", type=int, help="untimed cycles of each kind per round (200)")
    p.add_argument("--repeats", type=int, help="rounds, interleaved (3)")
    p.add_argument("--echo-at", help=argparse.SUPPRESS)  # the echo server's own process
    args = p.parse_args(argv)
    if args.echo_at:
        eventloop.run(_serve_echo(args.echo_at))
        return 0
    cycles = args.cycles or (200 if args.quick else 2000)
    warmup = args.warmup or (20 if args.quick else 200)
    repeats = args.repeats or (1 if args.quick else 3)
    wine = wine_version()
    where = "named pipe" if sys.platform == "win32" else "Unix socket"

    title = f"Lease cycle over the {where}, beside a {where} echo floor"
    if wine:
        title += f" (Windows under Wine {wine} on Linux)"
    report = Report(title, args.quick)
    broker = start_broker()
    echo_proc, echo_address = start_echo(short_tmp())
    address = {"broker": broker.socket, "echo": echo_address}
    p50: dict[str, list[float]] = {"broker": [], "echo": []}
    p99: dict[str, list[float]] = {"broker": [], "echo": []}
    try:
        for r in range(repeats):
            order = ["broker", "echo"] if r % 2 == 0 else ["echo", "broker"]
            lat = latencies({k: address[k] for k in order}, cycles, warmup)
            for k in order:
                p50[k].append(percentile(lat[k], 50))
                p99[k].append(percentile(lat[k], 99))
    finally:
        stopped = broker.stop()
        if stopped:
            report.note(stopped)
        echo_proc.kill()
        echo_proc.wait(10)

    lat_echo = per_round(p50["broker"], p50["echo"])
    report.add(
        "lease cycle, 1 client, p50",
        spread(p50["broker"], fmt_us),
        f"echo {spread(p50['echo'], fmt_us)}",
        f"{spread(lat_echo, fmt_x)} echo",
        "≤ 1.5× echo",
        verdict(median(lat_echo) <= TARGET_P50_ECHO),
    )
    p99_echo = per_round(p99["broker"], p99["echo"])
    report.add(
        "lease cycle, 1 client, p99",
        spread(p99["broker"], fmt_us),
        f"echo {spread(p99['echo'], fmt_us)}",
        f"{spread(p99_echo, fmt_x)} echo",
    )
    if wine:
        report.note(
            f"Windows under Wine {wine} on Linux: the named pipe as Wine implements it, so the "
            "ratio says what the code costs beside that pipe, not how fast Windows is (a "
            "ratio, not a promise about Windows); the load average of the Linux host is not "
            "visible from here."
        )
    report.note(
        f"{repeats} rounds, interleaved (each round measures both kinds, the one that goes "
        f"first alternating; within a round they take turns in 10 slices): {cycles} timed "
        f"cycles of each after {warmup} warm-up cycles. Each cell is the median of the rounds "
        "with their range; each ratio is taken within a round, then the median of those."
    )
    report.note(
        f"Floor: three JSON-line round trips carrying the same request parameters, to an echo "
        f"server in its own process served by rbroker.transport on the broker's event loop "
        f"(the same {where} code as the broker's), from a blocking client on "
        "rbroker.transport.connect. The broker's cycle goes through the SDK (`rbroker.Client`) "
        "with the renewal pipelined as the SDK's heartbeat sends it: two waits for an answer, "
        "against the floor's three."
    )
    report.finish(args.record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
