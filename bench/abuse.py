"""Hostile clients (issue "hostile clients and failing disks"): what abuse costs honest users.

Measures, in one run on one machine, each figure beside the same figure with no abuse:
- the broker's RSS while one client sends `leases.list` with ended leases (large answers)
  and never reads, and other clients' lease cycles (p50/p99) meanwhile;
- the lease cycle p50/p99 while 1 000 connections keep the broker busy (each with one
  `broker.status` request always in flight; half of them as a second OS user when run as
  root, since one user may hold at most `MAX_CONNECTIONS_PER_USER` connections);
- the coordinator: an honest computer's signed-report latency (p50/p99) while other
  processes hammer `/api/v1/enroll` with wrong codes, and how those are answered.

    python bench/abuse.py [--quick] [--record] [--busy 1000]
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import pwd
import selectors
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from typing import Any

import httpx
import nacl.signing
import psutil
from _common import (
    Report,
    StartGate,
    fmt_rate,
    fmt_us,
    parser,
    percentile,
    ratio,
    short_tmp,
    start_broker,
    timed_lease_cycle,
)
from tests.fakes.reports import GPU_A, payload, signed_body

import rbroker
from rbroker.demo.coordinator import LocalCoordinator
from rbroker.localapi.connection import MAX_UNSENT_BYTES
from rbroker.localapi.limits import MAX_CONNECTIONS_PER_USER
from rbroker_protocol.reports import GpuReport
from rbroker_protocol.signing import public_key_b64

PARAMS: dict[str, Any] = {"project": "bench", "session": "abuse", "purpose": "abuse benchmark"}
_ctx = mp.get_context("fork")


def _line(method: str, rid: int, **params: Any) -> bytes:
    msg = {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}
    return json.dumps(msg, separators=(",", ":")).encode() + b"\n"


def cycles_for(c: rbroker.Client, seconds: float, proc: psutil.Process | None = None) -> Any:
    """Lease cycles (acquire + renew + release) for `seconds`: their durations (s) and the
    peak RSS of `proc` sampled after each (bytes, 0 without `proc`)."""
    out: list[float] = []
    peak = 0
    end = time.monotonic() + seconds
    acquire = {"mib": 64, **PARAMS}
    while time.monotonic() < end:
        out.append(sum(timed_lease_cycle(c, acquire, pipelined=True)))
        if proc is not None:
            peak = max(peak, proc.memory_info().rss)
    return out, peak


# ---------------------------------------------------------------- 1 000 busy connections


def _busy_worker(path: str, count: int, uid: int | None, gate: StartGate, q: Any) -> None:
    """Hold `count` connections, each with one `broker.status` always in flight."""
    if uid is not None:
        entry = pwd.getpwuid(uid)
        os.setgroups([])
        os.setgid(entry.pw_gid)
        os.setuid(uid)
    sel = selectors.DefaultSelector()
    conns = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(path)
            s.setblocking(False)
            s.sendall(_line("broker.status", 1))
            sel.register(s, selectors.EVENT_READ, bytearray())
            conns.append(s)
    except OSError as exc:
        gate.arrive(ok=False)
        q.put((0, len(conns), repr(exc)))
        return
    end_at = gate.arrive() + 1e9
    answers = 0
    stop_at = float("inf")
    while time.monotonic() < min(end_at, stop_at):
        for key, _ in sel.select(0.5):
            s = key.fileobj
            buf = key.data
            try:
                chunk = s.recv(1 << 16)  # type: ignore[union-attr]
            except BlockingIOError:
                continue
            if not chunk:
                sel.unregister(s)
                continue
            buf += chunk
            while (nl := buf.find(b"\n")) >= 0:
                del buf[: nl + 1]
                answers += 1
                with contextlib.suppress(OSError):
                    s.sendall(_line("broker.status", answers))  # type: ignore[union-attr]
        if os.path.exists(path + ".stop-busy"):
            stop_at = 0
    q.put((answers, len(conns), ""))
    for s in conns:
        s.close()


def _other_user() -> tuple[int | None, str]:
    """A throwaway OS user's uid when running as root (and its name), else (None, why)."""
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        return None, "not root: every busy connection is this user's"
    name = f"rbbench-{os.getpid()}"
    subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
        check=True,
        capture_output=True,
    )
    return pwd.getpwnam(name).pw_uid, name


def _remove_user(name: str) -> None:
    subprocess.run(["userdel", name], capture_output=True)
    subprocess.run(["groupdel", name], capture_output=True)


def busy_cycles(broker: Any, total: int, seconds: float) -> dict[str, Any]:
    """Lease cycles of this user while another OS user keeps `total` connections busy (this
    user's own when not root: then the figure is not another user's); their answers/s too."""
    uid, who = _other_user()
    groups = [(uid, min(total, MAX_CONNECTIONS_PER_USER - 8))]
    if uid is not None:
        for path in (os.path.dirname(broker.socket),):
            os.chmod(path, 0o755)
        os.chmod(broker.socket, 0o666)
    q = _ctx.Queue()
    gate = StartGate(_ctx)
    procs = []
    for owner, count in groups:
        for part in range(2):
            n = count // 2 + (count % 2 if part == 0 else 0)
            procs.append(
                _ctx.Process(
                    target=_busy_worker, args=(broker.socket, n, owner, gate, q), daemon=True
                )
            )
    try:
        for p in procs:
            p.start()
        gate.open(len(procs))
        time.sleep(0.5)  # all busy
        with rbroker.Client(broker.socket, timeout_s=120) as c:
            t0 = time.monotonic()
            times, _ = cycles_for(c, seconds)
            took = time.monotonic() - t0
        open(broker.socket + ".stop-busy", "w").close()
        results = [q.get(timeout=60) for _ in procs]
        for p in procs:
            p.join(10)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        if uid is not None:
            _remove_user(who)
        with contextlib.suppress(OSError):
            os.unlink(broker.socket + ".stop-busy")
    errors = [r[2] for r in results if r[2]]
    return {
        "times": times,
        "connections": sum(r[1] for r in results),
        "answers_per_s": sum(r[0] for r in results) / max(took, 1e-9),
        "users": "another user (a throwaway one)" if uid is not None else who,
        "other_user": uid is not None,
        "errors": errors,
    }


# ---------------------------------------------------------------- the coordinator


HONEST_GPU = GpuReport(uuid=GPU_A, index=0, name="Simulated RTX 4090", total_mib=24576)
"""The honest computer's GPU, its name and size only."""


def _hammer(url: str, gate: StartGate, seconds: float, q: Any) -> None:
    key = nacl.signing.SigningKey.generate()
    wrong = {"code": "rbe_" + "a" * 12 + "_" + "b" * 32, "name": "guess",
             "public_key": public_key_b64(key)}  # fmt: skip
    codes: Counter[int] = Counter()
    with httpx.Client(base_url=url, timeout=30) as http:
        http.get("/healthz")
        end_at = gate.arrive() + seconds
        while time.monotonic() < end_at:
            codes[http.post("/api/v1/enroll", json=wrong).status_code] += 1
    q.put(dict(codes))


def report_latency(
    server: LocalCoordinator, n: int, hammers: int, seconds: float
) -> dict[str, Any]:
    """Honest report latencies (s) with no abuse, then while `hammers` processes send wrong
    enrollment codes; how the guesses were answered."""
    key = nacl.signing.SigningKey.generate()
    with httpx.Client(base_url=server.url, timeout=30) as http:
        r = http.post(
            "/api/v1/enroll",
            json={"code": server.first_code, "name": "honest-1", "public_key": public_key_b64(key)},
        )
        r.raise_for_status()
        cid = r.json()["computer_id"]
        seq = 0

        def one() -> float:
            nonlocal seq
            seq += 1
            report = payload("honest-1", "run-honest", gpus=[HONEST_GPU])
            body = signed_body(key, cid, "run-honest", seq, report)
            t0 = time.perf_counter()
            r = http.post("/api/v1/reports", content=body,
                          headers={"content-type": "application/json"})  # fmt: skip
            took = time.perf_counter() - t0
            if r.status_code != 200:
                raise RuntimeError(f"honest report answered {r.status_code}: {r.text}")
            return took

        for _ in range(20):
            one()
        quiet = [one() for _ in range(n)]
        q = _ctx.Queue()
        gate = StartGate(_ctx)
        procs = [
            _ctx.Process(target=_hammer, args=(server.url, gate, seconds, q), daemon=True)
            for _ in range(hammers)
        ]
        for p in procs:
            p.start()
        served = psutil.Process(server.proc.pid) if server.proc else None
        start = gate.open(hammers)
        cpu0 = sum(served.cpu_times()[:2]) if served else 0.0
        hammered = []
        while time.monotonic() < start + seconds:
            hammered.append(one())
        cpu = (sum(served.cpu_times()[:2]) - cpu0) / seconds * 100 if served else float("nan")
        codes: Counter[int] = Counter()
        for _ in procs:
            codes.update(q.get(timeout=60))
        for p in procs:
            p.join(10)
    return {
        "quiet": quiet,
        "hammered": hammered,
        "codes": codes,
        "seconds": seconds,
        "cpu": cpu,
    }


# ---------------------------------------------------------------- main


def _busy_rows(report: Report, quiet: list[float], busy_run: dict[str, Any]) -> None:
    bt = busy_run["times"]
    report.add(
        f"lease cycle p50 · p99, {busy_run['connections']:,} busy connections of "
        + ("another user" if busy_run["other_user"] else "this user"),
        f"{fmt_us(percentile(bt, 50))} · {fmt_us(percentile(bt, 99))}",
        f"no abuse {fmt_us(percentile(quiet, 50))} · {fmt_us(percentile(quiet, 99))}",
        f"{ratio(percentile(bt, 50), percentile(quiet, 50))} · "
        f"{ratio(percentile(bt, 99), percentile(quiet, 99))}",
        "≤ 5 ms p50" if busy_run["other_user"] else "—",
        (
            ("meets" if percentile(bt, 50) <= 0.005 else "**misses**")
            if busy_run["other_user"]
            else "—"
        ),
    )
    report.add(
        "busy connections: `broker.status` answers/s meanwhile",
        fmt_rate(busy_run["answers_per_s"]),
    )
    report.note(
        f"Busy connections: {busy_run['connections']:,} held by 2 processes of "
        f"{busy_run['users']}, each with one `broker.status` request always in flight; the "
        "lease cycles are this user's"
        + (f"; errors: {busy_run['errors']}" if busy_run["errors"] else "")
        + "."
    )


def _busy_only(report: Report, record: bool, quiet: list[float], busy_run: dict[str, Any]) -> int:
    report.add(
        "lease cycle p50 · p99, no abuse",
        f"{fmt_us(percentile(quiet, 50))} · {fmt_us(percentile(quiet, 99))}",
    )
    _busy_rows(report, quiet, busy_run)
    report.note(
        f"{os.cpu_count()} cores shared by the broker and every client process (`--busy-only`: "
        "the busy-connection figures alone)."
    )
    report.finish(record)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--busy", type=int, help="busy connections of one other user (default 500)")
    p.add_argument(
        "--busy-only", action="store_true", help="only the busy-connection figures (no coordinator)"
    )
    args = p.parse_args(argv)
    quick = args.quick
    busy = args.busy or (100 if quick else 500)
    window_s = 1.5 if quick else 5.0
    report = Report("Hostile clients: abuse beside no abuse", quick)

    broker = start_broker()
    try:
        proc = psutil.Process(broker.pid)
        with rbroker.Client(broker.socket, timeout_s=60) as c:
            cycles_for(c, 0.5)  # warm
            for _ in range(100 if quick else 500):  # ended leases make leases.list large
                lid = c.call("lease.acquire", mib=64, **PARAMS)["lease"]["lease_id"]
                c.call("lease.release", lease_id=lid)
            answer_bytes = len(json.dumps(c.call("leases.list", include_ended=True)))
            rss_quiet = proc.memory_info().rss
            quiet, _ = cycles_for(c, window_s, proc)
        busy_run = busy_cycles(broker, busy, window_s)
        if not args.busy_only:
            with rbroker.Client(broker.socket, timeout_s=60) as c:
                abuser = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                abuser.connect(broker.socket)
                requests = 500 if quick else 4000
                flood = _line("leases.list", 1, include_ended=True) * requests

                def send_flood() -> None:
                    with contextlib.suppress(OSError):  # dropped by the broker
                        abuser.sendall(flood)

                sender = threading.Thread(target=send_flood, daemon=True)
                sender.start()
                time.sleep(0.2)
                abused, peak = cycles_for(c, window_s, proc)
                abuser.close()
                sender.join(5)
    finally:
        stopped = broker.stop()
        if stopped:
            report.note(stopped)
    if args.busy_only:
        return _busy_only(report, args.record, quiet, busy_run)

    server = LocalCoordinator.setup(short_tmp("rbba-") / "server", database_url="")
    server.log_name = "serve.log"
    server.start(timeout_s=60)
    try:
        coord = report_latency(server, 50 if quick else 300, 2 if quick else 4, window_s * 2)
    finally:
        server.stop()

    mib = 2**20
    report.add(
        "broker RSS, one client not reading `leases.list` answers (peak)",
        f"{peak / mib:.1f} MiB",
        f"no abuse {rss_quiet / mib:.1f} MiB",
        f"+{(peak - rss_quiet) / mib:.1f} MiB",
        f"bounded (unsent cap {MAX_UNSENT_BYTES / mib:.0f} MiB a connection)",
    )
    for label, times in (("no abuse", quiet), ("a client not reading", abused)):
        report.add(
            f"lease cycle p50 · p99, {label}",
            f"{fmt_us(percentile(times, 50))} · {fmt_us(percentile(times, 99))}",
            "—"
            if label == "no abuse"
            else f"no abuse {fmt_us(percentile(quiet, 50))} · {fmt_us(percentile(quiet, 99))}",
            "—" if label == "no abuse" else ratio(percentile(times, 99), percentile(quiet, 99)),
            "within a few ms" if label != "no abuse" else "—",
        )
    _busy_rows(report, quiet, busy_run)
    cq, ch = coord["quiet"], coord["hammered"]
    report.add(
        "coordinator: honest report p50 · p99, enrollment hammered",
        f"{fmt_us(percentile(ch, 50))} · {fmt_us(percentile(ch, 99))}",
        f"no abuse {fmt_us(percentile(cq, 50))} · {fmt_us(percentile(cq, 99))}",
        f"{ratio(percentile(ch, 50), percentile(cq, 50))} · "
        f"{ratio(percentile(ch, 99), percentile(cq, 99))}",
        "not fivefold (the issue's figure before limits)",
    )
    codes = coord["codes"]
    guesses = sum(codes.values())
    report.add(
        "coordinator: wrong enrollment codes answered (per second; 401 · 429)",
        f"{fmt_rate(guesses / coord['seconds'])} ({codes.get(401, 0):,} · {codes.get(429, 0):,})",
        "limit: 10 failures a minute per address",
        "—",
        "429 past the limit",
    )
    report.add(
        "coordinator CPU while hammered (per refused attempt)",
        f"{coord['cpu']:.0f} % of one core "
        f"({fmt_us(coord['cpu'] / 100 * coord['seconds'] / max(guesses + len(ch), 1))} a request)",
    )
    report.note(
        f"Broker: one simulated 24 GiB GPU; {answer_bytes:,} B per `leases.list` answer with "
        f"ended leases; the abuser sends {requests:,} of them without reading; lease cycles of "
        f"another client for {window_s:g} s in each window, RSS sampled after every cycle."
    )
    report.note(
        f"Coordinator: `rbroker-server serve` (SQLite); one honest computer sends signed reports "
        f"one after another ({len(cq)} with no abuse, {len(ch)} while "
        f"{2 if quick else 4} processes send wrong enrollment codes for {coord['seconds']:g} s "
        "from the same address as fast as answered)."
    )
    report.note(
        f"{os.cpu_count()} cores shared by the broker or coordinator and every client process: "
        "where the hammering processes outnumber the cores, their own CPU delays the honest "
        "client and the server alike; the coordinator CPU row says what the refusals cost it."
    )
    report.finish(args.record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
