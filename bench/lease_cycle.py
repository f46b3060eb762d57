"""Lease cycle over the local API (architecture.md §10): acquire + renew + release against a real
broker.

Measures, in one run on one machine:
- the figure: `lease.acquire` + `lease.renew` + `lease.release` through `rbroker.Client` against
  a real simulated broker process, the renewal pipelined as the SDK's heartbeat sends it
  (`Client.call_nowait`: its answer is read with the release's): p50/p99 with 1 client,
  cycles/s with N client processes;
- the floor: three bare JSON-line round trips over a Unix socket (asyncio server process,
  blocking Python client, the same framing), 1 client and N clients;
- the anchor: a Redis lock cycle from redis-py (SET NX PX, PEXPIRE, DEL), 1 client and N
  clients, when redis-py is installed and Redis answers (`RBROKER_BENCH_REDIS_URL`, default
  redis://127.0.0.1:6379/0). etcd is not measured here (see the note it prints).

    python bench/lease_cycle.py [--quick] [--record] [--clients 50] [--cycles 3000] [--repeats 3]
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import os
import secrets
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

import psutil
from _common import (
    Report,
    StartGate,
    fmt_rate,
    fmt_us,
    fmt_x,
    interleaved,
    median,
    parser,
    per_round,
    percentile,
    ratio,
    short_tmp,
    spread,
    start_broker,
    timed_lease_cycle,
    verdict,
    wait_until_monotonic,
)

import rbroker

ACQUIRE: dict[str, Any] = {
    "mib": 64,
    "project": "bench",
    "purpose": "lease cycle benchmark",
    "ttl_s": 30.0,
    "wait_s": 30.0,
}
REDIS_URL = os.environ.get("RBROKER_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
TARGET_P50_ECHO = 1.5  # 1-client p50 ≤ 1.5× the echo floor's (architecture.md §10)
TARGET_RATE_ECHO = 0.5  # 50-client cycles/s ≥ 0.5× the echo floor's
ARCHITECTURE_ANCHORS = (
    "architecture.md §10 anchors: etcd lease cycle ≈ 900 µs p50, ≈ 4 400 cycles/s with 50"
)

_ctx = mp.get_context("fork")


# ---------------------------------------------------------------- the floor: a bare echo


class LineClient:
    """A blocking JSON-line client, built like `rbroker.Client`'s Unix stream, minus RPC."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.rfile = self.sock.makefile("rb")
        self.ids = 0

    def call(self, method: str, **params: Any) -> Any:
        self.ids += 1
        msg = {"jsonrpc": "2.0", "id": self.ids, "method": method, "params": params}
        self.sock.sendall(
            json.dumps(msg, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"
        )
        answer = json.loads(self.rfile.readline())
        return answer["result"]

    def close(self) -> None:
        self.rfile.close()
        self.sock.close()


def _echo_server(path: str) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                msg = json.loads(line)
                out = {"jsonrpc": "2.0", "id": msg.get("id"), "result": msg.get("params")}
                writer.write(json.dumps(out, separators=(",", ":")).encode() + b"\n")
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def main() -> None:
        server = await asyncio.start_unix_server(handle, path)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


def start_echo() -> tuple[Any, str]:
    """The echo floor server in its own process; returns (process, socket path)."""
    path = str(short_tmp() / "echo.sock")
    proc = _ctx.Process(target=_echo_server, args=(path,), daemon=True)
    proc.start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            LineClient(path).close()
            return proc, path
        except OSError:
            time.sleep(0.02)
    raise RuntimeError("echo server did not start")


# ---------------------------------------------------------------- the three kinds of cycle


def connect(kind: str, address: str) -> Any:
    if kind == "broker":
        return rbroker.Client(address, timeout_s=60)
    if kind == "echo":
        return LineClient(address)
    import redis

    return redis.Redis.from_url(address, socket_timeout=10)


def cycle_fn(kind: str, conn: Any, index: int) -> Callable[[], None]:
    """One cycle of `kind` on `conn` (client number `index`)."""
    if kind == "broker":
        params = {**ACQUIRE, "session": f"cycle-{index}"}

        def broker_cycle() -> None:
            lid = conn.call("lease.acquire", **params)["lease"]["lease_id"]
            conn.call_nowait("lease.renew", lease_id=lid)  # pipelined, as the SDK renews
            conn.call("lease.release", lease_id=lid)

        return broker_cycle
    if kind == "echo":
        params = {**ACQUIRE, "session": f"cycle-{index}"}

        def echo_cycle() -> None:
            conn.call("lease.acquire", **params)
            conn.call("lease.renew", lease_id="lease-0123456789ab")
            conn.call("lease.release", lease_id="lease-0123456789ab")

        return echo_cycle
    key = f"rbroker-bench:{os.getpid()}:{index}:gpu-lock"
    token = secrets.token_hex(8)

    def redis_cycle() -> None:
        if not conn.set(key, token, nx=True, px=30_000):
            raise RuntimeError(f"redis lock {key} was held")
        conn.pexpire(key, 30_000)
        conn.delete(key)

    return redis_cycle


def close(conn: Any) -> None:
    conn.close()


def latencies(
    address: dict[str, str], n: int, warmup: int, rounds: int = 10
) -> dict[str, list[float]]:
    """Durations (s) of `n` cycles by one client of each kind, after `warmup` untimed ones;
    the kinds take turns in `rounds` slices, so that load elsewhere hits them alike."""
    conns = {kind: connect(kind, addr) for kind, addr in address.items()}
    try:
        runs = {kind: cycle_fn(kind, conn, 0) for kind, conn in conns.items()}
        return interleaved(runs, n, warmup, rounds)
    finally:
        for conn in conns.values():
            close(conn)


def per_call(address: str, n: int) -> dict[str, list[float]]:
    """Durations (s) of each call of the broker's cycle, one client, `n` cycles."""
    out: dict[str, list[float]] = {"acquire": [], "renew": [], "release": []}
    with rbroker.Client(address, timeout_s=60) as conn:
        params = {**ACQUIRE, "session": "per-call"}
        for _ in range(n):
            acquire, renew, release = timed_lease_cycle(conn, params, pipelined=True)
            out["acquire"].append(acquire)
            out["renew"].append(renew)
            out["release"].append(release)
    return out


def _worker(kind: str, address: str, index: int, gate: StartGate, seconds: float, q: Any) -> None:
    done = errors = 0
    try:
        conn = connect(kind, address)
        run = cycle_fn(kind, conn, index)
        run()  # connected and warm before the start
    except Exception as exc:  # report, never hang the parent
        gate.arrive(ok=False)
        q.put((index, 0, 1, repr(exc)))
        return
    end_at = gate.arrive() + seconds
    while time.monotonic() < end_at:
        try:
            run()
            done += 1
        except (rbroker.RBrokerError, RuntimeError):
            errors += 1
    close(conn)
    q.put((index, done, errors, ""))


def throughput(
    kind: str, address: str, clients: int, duration_s: float, pid: int | None = None
) -> tuple[float, int, float]:
    """Cycles/s of `clients` processes running cycles for `duration_s`; also the number of
    errors and, when `pid` is given, that process's CPU use (% of one core) meanwhile."""
    q = _ctx.Queue()
    gate = StartGate(_ctx)
    procs = [
        _ctx.Process(target=_worker, args=(kind, address, i, gate, duration_s, q), daemon=True)
        for i in range(clients)
    ]
    for p in procs:
        p.start()
    watched = psutil.Process(pid) if pid else None
    start_at = gate.open(clients)
    cpu0 = sum(watched.cpu_times()[:2]) if watched else 0.0
    wait_until_monotonic(start_at + duration_s)
    cpu = (sum(watched.cpu_times()[:2]) - cpu0) / duration_s * 100 if watched else float("nan")
    results = [q.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(10)
    total = sum(r[1] for r in results)
    errors = sum(r[2] for r in results)
    for r in results:
        if r[3]:
            print(f"  client {r[0]} of {kind} failed: {r[3]}", file=sys.stderr)
    return total / duration_s, errors, cpu


def redis_available() -> str | None:
    """None when Redis can be used for the anchor, else why not."""
    try:
        import redis
    except ImportError:
        return "redis-py is not installed (`uv pip install redis` into the venv to add it)"
    try:
        redis.Redis.from_url(REDIS_URL, socket_timeout=2).ping()
    except Exception as exc:  # any failure means no anchor
        return f"Redis does not answer at {REDIS_URL} ({exc.__class__.__name__})"
    return None


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, help="concurrent client processes (default 50)")
    p.add_argument("--cycles", type=int, help="timed cycles for the 1-client latency")
    p.add_argument("--seconds", type=float, help="duration of each concurrent run")
    p.add_argument("--repeats", type=int, help="rounds of every measurement, interleaved (3)")
    args = p.parse_args(argv)
    clients = args.clients or (8 if args.quick else 50)
    cycles = args.cycles or (200 if args.quick else 3000)
    warmup = 50 if args.quick else 300
    seconds = args.seconds or (1.0 if args.quick else 8.0)
    repeats = args.repeats or (1 if args.quick else 3)

    report = Report("Lease cycle over the local API (acquire + renew + release)", args.quick)
    broker = start_broker()
    echo_proc, echo_path = start_echo()
    no_redis = redis_available()
    kinds = ["echo", "broker"] + ([] if no_redis else ["redis"])
    address = {"echo": echo_path, "broker": broker.socket, "redis": REDIS_URL}
    # per round: p50, p99, cycles/s of each kind; per-call p50s and broker CPU of the broker
    p50: dict[str, list[float]] = {k: [] for k in kinds}
    p99: dict[str, list[float]] = {k: [] for k in kinds}
    rate: dict[str, list[float]] = {k: [] for k in kinds}
    calls: dict[str, list[float]] = {"acquire": [], "renew": [], "release": []}
    cpu_broker: list[float] = []
    errors: dict[str, int] = dict.fromkeys(kinds, 0)
    try:
        for r in range(repeats):
            order = kinds[r % len(kinds) :] + kinds[: r % len(kinds)]  # who goes first rotates
            lat = latencies({k: address[k] for k in order}, cycles, warmup)
            for k in kinds:
                p50[k].append(percentile(lat[k], 50))
                p99[k].append(percentile(lat[k], 99))
            for name, values in per_call(broker.socket, max(100, cycles // 3)).items():
                calls[name].append(percentile(values, 50))
            for kind in order:
                pid = broker.pid if kind == "broker" else None
                got, errs, cpu = throughput(kind, address[kind], clients, seconds, pid)
                rate[kind].append(got)
                errors[kind] += errs
                if kind == "broker":
                    cpu_broker.append(cpu)
    finally:
        stopped = broker.stop()
        if stopped:
            report.note(stopped)
        echo_proc.kill()
        echo_proc.join(5)

    has_redis = "redis" in p50
    lat_echo = per_round(p50["broker"], p50["echo"])
    lat_redis = per_round(p50["broker"], p50["redis"]) if has_redis else []
    rate_echo = per_round(rate["broker"], rate["echo"])
    rate_redis = per_round(rate["broker"], rate["redis"]) if has_redis else []
    us = lambda k: spread(p50[k], fmt_us)  # noqa: E731
    report.add(
        "lease cycle, 1 client, p50",
        us("broker"),
        f"echo {us('echo')}" + (f" · Redis {us('redis')}" if has_redis else ""),
        f"{spread(lat_echo, fmt_x)} echo"
        + (f" · {spread(lat_redis, fmt_x)} Redis" if has_redis else ""),
        "≤ 1.5× echo and < Redis",
        verdict(median(lat_echo) <= TARGET_P50_ECHO and (not has_redis or median(lat_redis) < 1)),
    )
    report.add(
        "lease cycle, 1 client, p99",
        spread(p99["broker"], fmt_us),
        f"echo {spread(p99['echo'], fmt_us)}"
        + (f" · Redis {spread(p99['redis'], fmt_us)}" if has_redis else ""),
        f"{fmt_x(median(per_round(p99['broker'], p99['echo'])))} echo",
    )
    echo_rt = [v / 3 for v in p50["echo"]]
    report.add(
        "1 client, p50 of each call: acquire · renew (pipelined: the write) · release",
        " · ".join(spread(calls[k], fmt_us) for k in ("acquire", "renew", "release")),
        f"echo round trip ≈ {spread(echo_rt, fmt_us)} (⅓ of its cycle)",
        " · ".join(
            fmt_x(median(per_round(calls[k], echo_rt))) for k in ("acquire", "renew", "release")
        ),
    )
    rt = lambda k: spread(rate[k], fmt_rate)  # noqa: E731
    report.add(
        f"lease cycles/s, {clients} client processes",
        rt("broker"),
        f"echo {rt('echo')}" + (f" · Redis {rt('redis')}" if has_redis else ""),
        f"{spread(rate_echo, fmt_x)} echo"
        + (f" · {spread(rate_redis, fmt_x)} Redis" if has_redis else ""),
        "≥ 0.5× echo and ≥ Redis",
        verdict(
            median(rate_echo) >= TARGET_RATE_ECHO and (not has_redis or median(rate_redis) >= 1)
        ),
    )
    cps = [r / max(c / 100, 1e-9) for r, c in zip(rate["broker"], cpu_broker, strict=True)]
    report.add(
        f"broker CPU during the {clients}-client run",
        f"{spread(cpu_broker, lambda v: f'{v:.0f} %')} of one core",
        "—",
        f"{spread(cps, lambda v: f'{v:,.0f}')} cycles per CPU-second",
    )
    report.add(
        "calibration: echo floor, one round trip p50",
        spread(echo_rt, fmt_us),
        "architecture.md §10's machine: ≈ 75 µs",
        ratio(median(echo_rt), 75e-6),
    )
    if has_redis:
        report.add(
            f"calibration: Redis cycle, 1-client p50 · {clients}-client rate",
            f"{us('redis')} · {rt('redis')}",
            "architecture.md §10's machine: ≈ 300 µs · ≈ 6 700/s (50 clients)",
            f"{ratio(median(p50['redis']), 300e-6)} · {ratio(median(rate['redis']), 6700.0)}",
        )
    report.note(
        f"{repeats} rounds, interleaved (each round measures every kind, the kind that goes "
        "first rotating); each cell is the median of the rounds with their range, and each "
        "ratio is taken within a round, then the median of those. Per round: 1-client "
        f"figures: {cycles} timed cycles after {warmup} warm-up cycles, the kinds taking turns "
        f"in 10 slices; {clients}-client figures: {seconds:g} s of cycles by {clients} "
        "separate processes, each on its own connection (errors over all rounds: "
        + ", ".join(f"{k} {v}" for k, v in errors.items())
        + ")."
    )
    report.note(
        "Floor: three JSON-line round trips (asyncio Unix-socket server in its own process, "
        "blocking client with the same framing) carrying the same request parameters. The "
        "broker's cycle goes through the SDK (`rbroker.Client`) with the renewal pipelined as "
        "the SDK's heartbeat sends it (`call_nowait`; its answer is read with the "
        "release's): two waits for an answer, against the floor's three."
    )
    if no_redis:
        report.note(f"Redis anchor skipped: {no_redis}.")
    else:
        report.note(
            "Redis anchor: redis-py SET key NX PX 30000, PEXPIRE key 30000, DEL key (one key "
            f"per client) against {REDIS_URL} on this machine."
        )
    report.note(f"etcd is not available on this machine: not measured ({ARCHITECTURE_ANCHORS}).")
    report.note(
        f"{os.cpu_count()} cores are shared by the server under test and every client "
        "process; the broker CPU row shows how busy the broker itself was meanwhile."
    )
    report.finish(args.record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
