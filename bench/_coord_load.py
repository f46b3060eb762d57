"""The coordinator benchmark's HTTP load: pre-signed reports sent once each, in seq order per
computer, over keep-alive connections to one or several `rbroker-server serve` processes.

Two load generators send the same plan (`Lane`s: one per connection, each owning a disjoint
set of computers, so each computer's reports go out in seq order on one connection):

- `wrk` (C, epoll) driven by `bench/wrk_reports.lua`: one wrk thread per connection, raw
  HTTP requests written to files before the timed window; light enough that the server,
  not the client, is what a small machine measures;
- `httpx` client processes (the fallback when wrk is not installed): asyncio, one coroutine
  per connection; on 2 cores they use more CPU than the server and cap the figure.

Both count the answers: 200 with `"applied": true`, 200 otherwise (not applied), any
other status or a failed request (errors).
"""

from __future__ import annotations

import asyncio
import math
import multiprocessing as mp
import os
import resource
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
from _common import BENCH_DIR, StartGate, short_tmp
from _coord_fixture import Computer

from rbroker.demo.coordinator import LocalCoordinator

WRK_SCRIPT = BENCH_DIR / "wrk_reports.lua"
REPORTS_PATH = "/api/v1/reports"
GENERATORS = ("auto", "wrk", "httpx")

_ctx = mp.get_context("fork")


@dataclass
class Lane:
    """One connection's work: the server's port and the envelopes, in sending order."""

    port: int
    bodies: list[bytes]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass
class Load:
    """What one load run measured. `rate`: applied reports/s over `seconds` (first request
    sent until the last answer read); `server_cpu` / `client_cpu`: % of one core over that
    window (all the servers together; the load generator's processes)."""

    generator: str
    rate: float
    applied: int
    not_applied: int
    errors: int
    planned: int
    seconds: float
    server_cpu: float
    client_cpu: float
    failures: list[str] = field(default_factory=list)


def plan_lanes(
    servers: Sequence[LocalCoordinator], computers: Sequence[Computer], connections: int,
    seqs: range,
) -> list[Lane]:  # fmt: skip
    """`connections` lanes (at most one per computer), lane i to `servers[i % len]`, lane i
    owning `computers[i::n]`: each computer's reports with `seqs`, round by round.

    Raises:
        ValueError: no server, no computer or fewer than one connection.
    """
    if not servers or not computers or connections < 1:
        raise ValueError("a load plan needs a server, a computer and a connection")
    n = min(connections, len(computers))
    lanes = []
    for i in range(n):
        mine = computers[i::n]
        signed = [c.bodies(seqs) for c in mine]
        bodies = [s[r] for r in range(len(seqs)) for s in signed]
        lanes.append(Lane(servers[i % len(servers)].port, bodies))
    return lanes


def wrk_path() -> str | None:
    """The wrk executable (`RBROKER_BENCH_WRK`, else `wrk` on PATH), or None."""
    return os.environ.get("RBROKER_BENCH_WRK") or shutil.which("wrk")


def pick_generator(wanted: str) -> tuple[str, str]:
    """(`wrk` | `httpx`, why) for `--generator wanted` (`auto`: wrk when installed).

    Raises:
        ValueError: `wanted` is unknown, or `wrk` was asked for and is not installed.
    """
    if wanted not in GENERATORS:
        raise ValueError(f"unknown load generator {wanted!r} (one of {', '.join(GENERATORS)})")
    found = wrk_path()
    if wanted == "wrk" and not found:
        raise ValueError("--generator wrk: wrk is not installed (apt-get install wrk)")
    if wanted == "httpx":
        return "httpx", "httpx asked for (--generator httpx)"
    if found:
        return "wrk", f"wrk at {found}"
    return "httpx", "wrk is not installed (apt-get install wrk): httpx fallback"


def run_load(
    generator: str, servers: Sequence[LocalCoordinator], lanes: Sequence[Lane],
    limit_s: float, processes: int,
) -> Load:  # fmt: skip
    """Send `lanes` with `generator` (`wrk` or `httpx` with `processes` client processes)
    for at most about `limit_s`, measuring the CPU of `servers` meanwhile."""
    if generator == "wrk":
        return wrk_load(servers, lanes, limit_s)
    return httpx_load(servers, lanes, limit_s, processes)


def _server_cpu_s(servers: Sequence[LocalCoordinator]) -> float:
    total = 0.0
    for s in servers:
        assert s.proc is not None
        total += sum(psutil.Process(s.proc.pid).cpu_times()[:2])
    return total


# ---------------------------------------------------------------- wrk


def raw_request(port: int, body: bytes) -> bytes:
    """`POST /api/v1/reports` of `body` as HTTP/1.1 bytes (keep-alive)."""
    head = (
        f"POST {REPORTS_PATH} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode("ascii") + body


def write_plan(lanes: Sequence[Lane], folder: Path) -> Path:
    """The request files of `lanes` and the plan file that names them (wrk_reports.lua)."""
    lines = []
    for i, lane in enumerate(lanes):
        path = folder / f"lane-{i:04d}.req"
        with path.open("wb") as f:
            for body in lane.bodies:
                req = raw_request(lane.port, body)
                f.write(b"%d\n" % len(req))
                f.write(req)
        lines.append(f"{lane.port} {len(lane.bodies)} {path}")
    plan = folder / "plan.txt"
    plan.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return plan


def wrk_load(servers: Sequence[LocalCoordinator], lanes: Sequence[Lane], limit_s: float) -> Load:
    """One wrk run of `lanes` (a thread and a connection each), stopped with SIGINT once
    every thread had its last answer, or by wrk itself after `limit_s` (rounded up)."""
    exe = wrk_path()
    if exe is None:
        raise RuntimeError("wrk is not installed")
    folder = short_tmp("rbwrk-")
    try:
        plan = write_plan(lanes, folder)
        n = len(lanes)
        cmd = [
            exe, "-t", str(n), "-c", str(n), "-d", f"{max(1, math.ceil(limit_s))}s",
            "--timeout", "30s", "-s", str(WRK_SCRIPT), lanes[0].url,
        ]  # fmt: skip
        env = {**os.environ, "RBROKER_WRK_PLAN": str(plan)}
        out: list[str] = []
        all_done = threading.Event()
        rusage0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu0 = _server_cpu_s(servers)
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True
        )

        def read() -> None:
            assert proc.stdout is not None
            finished = 0
            for line in proc.stdout:
                out.append(line)
                if line.startswith("rbroker-wrk finished "):
                    finished += 1
                    if finished == n:
                        all_done.set()
            all_done.set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        all_done.wait(limit_s + 60)
        cpu1 = _server_cpu_s(servers)
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # wrk stops its threads and runs done()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        reader.join(10)
        assert proc.stderr is not None
        stderr = proc.stderr.read()
        rusage1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return _wrk_figures(out, stderr, proc.returncode, n, cpu1 - cpu0, rusage0, rusage1)


def _wrk_figures(
    out: list[str], stderr: str, rc: int, n: int, server_cpu_s: float,
    rusage0: Any, rusage1: Any,
) -> Load:  # fmt: skip
    results = [ln.split()[2:] for ln in out if ln.startswith("rbroker-wrk result ")]
    sockets = [ln.split()[2:] for ln in out if ln.startswith("rbroker-wrk socket ")]
    failures = []
    if len(results) != n:
        tail = (stderr.strip() or "".join(out).strip())[-800:]
        failures.append(f"wrk exited with {rc}, {len(results)} of {n} thread results: {tail}")
    applied = sum(int(r[1]) for r in results)
    not_applied = sum(int(r[2]) for r in results)
    errors = sum(int(r[3]) for r in results)
    answered = sum(int(r[4]) for r in results)
    planned = sum(int(r[5]) for r in results)
    if answered < planned:
        failures.append(f"the window ended after {answered:,} of {planned:,} answers")
    if sockets and any(int(v) for v in sockets[0]):
        connect, read, write, timeout = sockets[0]
        failures.append(f"wrk socket errors: connect {connect}, read {read}, write {write}, "
                        f"timeout {timeout}")  # fmt: skip
    starts = [float(r[6]) for r in results if float(r[6]) > 0]
    ends = [float(r[7]) for r in results if float(r[7]) > 0]
    seconds = max(ends) - min(starts) if starts and ends else math.nan
    client_s = (rusage1.ru_utime - rusage0.ru_utime) + (rusage1.ru_stime - rusage0.ru_stime)
    ok = seconds > 0
    return Load(
        generator="wrk",
        rate=applied / seconds if ok else math.nan,
        applied=applied,
        not_applied=not_applied,
        errors=errors,
        planned=planned,
        seconds=seconds,
        server_cpu=server_cpu_s / seconds * 100 if ok else math.nan,
        client_cpu=client_s / seconds * 100 if ok else math.nan,
        failures=failures,
    )


# ---------------------------------------------------------------- httpx (fallback)


def _sender(lanes: list[Lane], gate: StartGate, limit_s: float, q: Any) -> None:
    """Send `lanes` (one coroutine and connection each) from the common start until done
    or `limit_s` after it; put (counts, end time, CPU seconds, failure) on `q`."""
    arrived = False
    try:
        counts = {"applied": 0, "not_applied": 0, "errors": 0}
        end_at = 0.0

        async def lane(client: httpx.AsyncClient, mine: Lane) -> None:
            url = mine.url + REPORTS_PATH
            headers = {"content-type": "application/json"}
            for body in mine.bodies:
                if time.monotonic() >= end_at:
                    return
                try:
                    resp = await client.post(url, content=body, headers=headers)
                except httpx.HTTPError:
                    counts["errors"] += 1
                    continue
                if resp.status_code != 200:
                    counts["errors"] += 1
                elif resp.json().get("applied"):
                    counts["applied"] += 1
                else:
                    counts["not_applied"] += 1

        async def run() -> None:
            nonlocal arrived, end_at
            n = len(lanes)
            limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
            async with httpx.AsyncClient(limits=limits, timeout=60) as client:
                # the connections open before the start
                await asyncio.gather(*(client.get(ln.url + "/healthz") for ln in lanes))
                arrived = True
                end_at = gate.arrive() + limit_s
                t0 = time.process_time()
                await asyncio.gather(*(lane(client, ln) for ln in lanes))
                cpu = time.process_time() - t0
            q.put((counts, time.monotonic(), cpu, ""))

        asyncio.run(run())
    except Exception as exc:  # report, never hang the parent
        if not arrived:
            gate.arrive(ok=False)
        q.put(({"applied": 0, "not_applied": 0, "errors": 1}, time.monotonic(), 0.0, repr(exc)))


def httpx_load(
    servers: Sequence[LocalCoordinator], lanes: Sequence[Lane], limit_s: float, processes: int
) -> Load:
    """`lanes` spread over `processes` httpx client processes started together."""
    processes = max(1, min(processes, len(lanes)))
    q = _ctx.Queue()
    gate = StartGate(_ctx)
    procs = [
        _ctx.Process(
            target=_sender, args=(list(lanes[i::processes]), gate, limit_s, q), daemon=True
        )
        for i in range(processes)
    ]
    for p in procs:
        p.start()
    start_at = gate.open(processes)
    c0 = _server_cpu_s(servers)
    results = [q.get(timeout=limit_s + 300) for _ in procs]
    c1 = _server_cpu_s(servers)
    for p in procs:
        p.join(10)
    seconds = max(1e-9, max(r[1] for r in results) - start_at)
    applied = sum(r[0]["applied"] for r in results)
    not_applied = sum(r[0]["not_applied"] for r in results)
    errors = sum(r[0]["errors"] for r in results)
    planned = sum(len(ln.bodies) for ln in lanes)
    failures = [r[3] for r in results if r[3]]
    if applied + not_applied + errors < planned and not failures:
        failures.append(f"the window ended after {applied + not_applied + errors:,} of "
                        f"{planned:,} answers")  # fmt: skip
    return Load(
        generator="httpx",
        rate=applied / seconds,
        applied=applied,
        not_applied=not_applied,
        errors=errors,
        planned=planned,
        seconds=seconds,
        server_cpu=(c1 - c0) / seconds * 100,
        client_cpu=sum(r[2] for r in results) / seconds * 100,
        failures=failures,
    )
