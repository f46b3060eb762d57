"""A big group's fleet page: 300 computers × 200 leases, 4 viewers, and a slowloris load.

A real `rbroker-server serve` process (SQLite, one worker). One computer enrolled and
reporting a big state (2 GPUs, `--leases` leases, 10 waiting requests, 3 jobs: ≈ 60 KB of
JSON), cloned to `--computers` computers with their state. Four signed-in viewers (four
sessions, one thread and one keep-alive connection each) refresh every 5 s as the page does
(`GET /fleet/live` with the `If-None-Match` of their last answer), their starts spread over
the period; beside them, in the same run, the same four viewers reading the JSON fleet
`GET /api/v1/fleet` (the floor: the same rows read and serialised, no page). Measured: the
client-side p50 / p99 of a refresh, the server process's CPU over the window (user +
system, % of one core) and its largest RSS, the bytes of one refresh.

Then the slowloris: `--slow` connections (1 100) from five loopback addresses (127.0.0.2–6,
220 each: under the per-address cap, so every one is held open, not refused) that each send
one byte of a request head every 2 s and reconnect when cut; meanwhile `GET /healthz` from
127.0.0.1 every 0.25 s on fresh connections, beside the same probe with no load (the floor).
Numbers are printed, never asserted.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
import threading
import time
from dataclasses import dataclass, field

import httpx
import psutil
from _common import Report, fmt_ms, parser, percentile, verdict
from _coord_fixture import clone_computers, enroll, start_server
from tests.fakes.reports import GPU_A, GPU_B, gpu_report, payload, signed_body

from rbroker_protocol.reports import JobSnapshot, LeaseReport, QueueEntry

REFRESH_S = 5.0
VIEWERS = 4
GPUS = (GPU_A, GPU_B)
SLOW_SOURCES = ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5", "127.0.0.6")


def big_payload(name: str, run_id: str, seq: int, leases: int) -> bytes:
    """A busy computer's report: 2 GPUs, `leases` leases, 10 waiting requests, 3 jobs."""
    now = time.time()
    return payload(
        name,
        run_id,
        generated_at=now,
        gpus=[
            gpu_report(
                uuid,
                i,
                name="Simulated A100",
                total_mib=81920,
                headroom_mib=4096,
                leased_in_use_mib=58000,
                other_in_use_mib=2000,
                outstanding_mib=2000,
            )
            for i, uuid in enumerate(GPUS)
        ],
        leases=[
            LeaseReport(
                lease_id=f"lease-{seq:04x}-{i:05d}",
                gpu_uuids=[GPUS[i % 2]],
                granted_mib=600,
                owner=f"user{i % 17}",
                project="vision",
                session=f"sweep-{i}",
                purpose="hyper-parameter sweep of a ViT-B on the lab corpus",
                granted_at=now - 600,
                expires_in_s=25.0,
                observed_mib={GPUS[i % 2]: 580},
            )
            for i in range(leases)
        ],
        queue=[
            QueueEntry(
                mib=8192,
                owner=f"user{i}",
                project="nlp",
                session=f"eval-{i}",
                purpose="evaluate",
                waiting_s=30.0 * i,
                reason="no GPU has 8 GiB free",
            )
            for i in range(10)
        ],
        jobs=[
            JobSnapshot(
                job_id=f"job-{j}",
                project="search",
                purpose="embed corpus",
                handler="embed.encode_batch",
                workers=4,
                total_items=100_000,
                completed_items=seq * 100 + j,
            )
            for j in range(3)
        ],
    ).to_bytes()


@dataclass
class Window:
    """What one measured window saw: client durations (s), server CPU (% of one core), the
    server's largest RSS (MiB), statuses by code."""

    durations_s: list[float] = field(default_factory=list)
    cpu_pct: float = 0.0
    rss_mib: float = 0.0
    statuses: dict[int, int] = field(default_factory=dict)


def viewers(
    clients: list[httpx.Client],
    proc: psutil.Process,
    path: str,
    seconds: float,
    headers: dict[str, str] | None = None,
    conditional: bool = False,
) -> Window:
    """`len(clients)` viewers refreshing `path` every `REFRESH_S` for `seconds`, their first
    refreshes spread evenly over one period; a refresh that takes longer than the period
    delays the next (as the page does)."""
    out = Window()
    lock = threading.Lock()
    stop_at = time.monotonic() + seconds
    rss = [proc.memory_info().rss]

    def viewer(k: int, client: httpx.Client) -> None:
        etag: str | None = None
        due = time.monotonic() + k * REFRESH_S / len(clients)
        while True:
            time.sleep(max(0.0, due - time.monotonic()))
            if time.monotonic() >= stop_at:
                return
            h = dict(headers or {})
            if conditional and etag:
                h["if-none-match"] = etag
            t0 = time.perf_counter()
            r = client.get(path, headers=h)
            took = time.perf_counter() - t0
            etag = r.headers.get("etag", etag)
            with lock:
                out.durations_s.append(took)
                out.statuses[r.status_code] = out.statuses.get(r.status_code, 0) + 1
            due = max(due + REFRESH_S, time.monotonic())

    cpu0, t0 = sum(proc.cpu_times()[:2]), time.monotonic()
    threads = [threading.Thread(target=viewer, args=(k, c)) for k, c in enumerate(clients)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        rss.append(proc.memory_info().rss)
        time.sleep(0.5)
    out.cpu_pct = 100 * (sum(proc.cpu_times()[:2]) - cpu0) / (time.monotonic() - t0)
    out.rss_mib = max(rss) / 2**20
    return out


def sign_in(url: str, token: str) -> httpx.Client:
    client = httpx.Client(base_url=url, timeout=120)
    form = client.get("/signin").text
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', form)
    assert csrf is not None
    r = client.post("/signin", data={"token": token, "csrf_token": csrf.group(1)})
    assert r.status_code == 303, r.text
    return client


def probe_healthz(url: str, seconds: float, every_s: float = 0.25) -> list[float]:
    """`GET /healthz` on a fresh connection every `every_s` for `seconds`: durations (s);
    a failed probe counts as its time to fail (at most 10 s)."""
    out = []
    stop_at = time.monotonic() + seconds
    while time.monotonic() < stop_at:
        t0 = time.perf_counter()
        with contextlib.suppress(httpx.HTTPError):
            httpx.get(url + "/healthz", timeout=10).raise_for_status()
        out.append(time.perf_counter() - t0)
        time.sleep(max(0.0, every_s - (time.perf_counter() - t0)))
    return out


class Slowloris:
    """`count` connections from `SLOW_SOURCES` dribbling a request head, one byte every
    `every_s`, reconnecting when the server cuts them; `open_now` counts those open."""

    def __init__(self, port: int, count: int, every_s: float = 2.0) -> None:
        self.port, self.count, self.every_s = port, count, every_s
        self.open_now = 0
        self.cut = 0
        self.peak_open = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    def __enter__(self) -> Slowloris:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    async def _one(self, k: int) -> None:
        source = SLOW_SOURCES[k % len(SLOW_SOURCES)]
        head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 4096
        while not self._stop.is_set():
            try:
                _, writer = await asyncio.open_connection(
                    "127.0.0.1", self.port, local_addr=(source, 0)
                )
            except OSError:
                await asyncio.sleep(self.every_s)
                continue
            self.open_now += 1
            self.peak_open = max(self.peak_open, self.open_now)
            try:
                for i in range(len(head)):
                    if self._stop.is_set():
                        break
                    writer.write(head[i : i + 1])
                    await writer.drain()
                    await asyncio.sleep(self.every_s)
            except (OSError, ConnectionError):
                self.cut += 1
            finally:
                self.open_now -= 1
                writer.close()
                with contextlib.suppress(Exception):
                    await writer.wait_closed()

    async def _main(self) -> None:
        tasks = []
        for k in range(self.count):
            tasks.append(asyncio.create_task(self._one(k)))
            if k % 50 == 49:
                await asyncio.sleep(0.05)  # a ramp, not one SYN burst
        while not self._stop.is_set():
            await asyncio.sleep(0.2)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--computers", type=int, help="computers in the group (300)")
    p.add_argument("--leases", type=int, help="leases per computer (200)")
    p.add_argument("--seconds", type=float, help="each viewers' window (60 s)")
    p.add_argument("--slow", type=int, help="slowloris connections (1 100)")
    p.add_argument("--slow-seconds", type=float, help="the slowloris window (30 s)")
    args = p.parse_args(argv)
    computers = args.computers or (10 if args.quick else 300)
    leases = args.leases or (20 if args.quick else 200)
    seconds = args.seconds or (6.0 if args.quick else 60.0)
    slow = args.slow if args.slow is not None else (100 if args.quick else 1100)
    slow_s = args.slow_seconds or (4.0 if args.quick else 30.0)
    report = Report(
        f"Fleet page of a big group: {computers} computers × {leases} leases, "
        f"{VIEWERS} viewers; slowloris of {slow:,} connections",
        args.quick,
    )
    server = start_server(None)
    try:
        from rbroker_server.db import engine as db

        engine = db.make_engine(f"sqlite:///{(server.data_dir / 'rbroker-server.db').as_posix()}")
        (first,) = enroll(engine, 1, 0)
        with httpx.Client(base_url=server.url, timeout=60) as client:
            for seq in (1, 2):
                state = big_payload(first.name, first.run_id, seq, leases)
                body = signed_body(first.key, first.id, first.run_id, seq, state)
                client.post(
                    "/api/v1/reports", content=body, headers={"content-type": "application/json"}
                ).raise_for_status()
        clone_computers(engine, first.id, computers - 1)
        engine.dispose()
        proc = psutil.Process(server.proc.pid)
        auth = {"authorization": f"Bearer {server.token}"}
        clients = [sign_in(server.url, server.token) for _ in range(VIEWERS)]
        try:
            page = clients[0].get("/fleet/live")  # also warms the process
            page.raise_for_status()
            page_bytes = (page.num_bytes_downloaded, len(page.content))
            full = clients[0].get("/fleet")
            api = clients[0].get("/api/v1/fleet", headers=auth)
            api.raise_for_status()
            api_bytes = (api.num_bytes_downloaded, len(api.content))
            # the JSON fleet compressed (httpx asks for gzip) and not (identity), in turns
            wire: dict[str, list[float]] = {"gzip": [], "identity": []}
            took: dict[str, list[float]] = {"gzip": [], "identity": []}
            for _ in range(3):
                for coding in ("gzip", "identity"):
                    t_get = time.perf_counter()
                    got = clients[0].get(
                        "/api/v1/fleet", headers={**auth, "accept-encoding": coding}
                    )
                    took[coding].append(time.perf_counter() - t_get)
                    got.raise_for_status()
                    wire[coding].append(got.num_bytes_downloaded)
            floor = viewers(clients, proc, "/api/v1/fleet", seconds, headers=auth)
            fleet = viewers(clients, proc, "/fleet/live", seconds, conditional=True)
        finally:
            for c in clients:
                c.close()
        quiet = probe_healthz(server.url, min(slow_s, 10.0))
        cpu0, t0 = sum(proc.cpu_times()[:2]), time.monotonic()
        with Slowloris(server.port, slow) as loris:
            time.sleep(min(10.0, slow_s / 3))  # the ramp: every connection opened
            held = loris.open_now
            loaded = probe_healthz(server.url, slow_s)
            held_end, cut = loris.open_now, loris.cut
        loris_cpu = 100 * (sum(proc.cpu_times()[:2]) - cpu0) / (time.monotonic() - t0)
        loris_rss = proc.memory_info().rss / 2**20
    finally:
        server.stop()

    def p(w: list[float], q: float) -> str:
        return fmt_ms(percentile(w, q))

    p50 = percentile(fleet.durations_s, 50)
    report.add(
        f"fleet page refresh (/fleet/live), {VIEWERS} viewers every {REFRESH_S:.0f} s: p50",
        p(fleet.durations_s, 50),
        f"JSON fleet read p50 {p(floor.durations_s, 50)}",
        f"{p50 / percentile(floor.durations_s, 50):.3g}× the JSON read",
        "< 1 s",
        verdict(p50 < 1.0),
    )
    report.add(
        "fleet page refresh: p99",
        p(fleet.durations_s, 99),
        f"JSON fleet read p99 {p(floor.durations_s, 99)}",
    )
    report.add(
        "coordinator CPU while they refresh",
        f"{fleet.cpu_pct:.1f} % of one core",
        f"JSON read {floor.cpu_pct:.1f} %",
        "—",
        "< 100 %",
        verdict(fleet.cpu_pct < 100),
    )
    report.add(
        "coordinator RSS (largest, sampled every 0.5 s)",
        f"{fleet.rss_mib:.0f} MiB",
        f"JSON read {floor.rss_mib:.0f} MiB",
    )
    report.add(
        "one refresh: bytes on the wire (gzip) · decoded",
        f"{page_bytes[0]:,} B · {page_bytes[1]:,} B",
        f"JSON (not compressed) {api_bytes[1]:,} B",
        f"{page_bytes[1] / api_bytes[1]:.3f}× the JSON",
        "< 1 MB",
        verdict(page_bytes[1] < 1_000_000),
    )
    gz_b, raw_b = wire["gzip"][-1], wire["identity"][-1]
    report.add(
        "JSON fleet (/api/v1/fleet): bytes on the wire, gzip · identity",
        f"{gz_b:,.0f} B · {raw_b:,.0f} B",
        f"identity {raw_b:,.0f} B",
        f"{gz_b / raw_b:.3f}× identity",
    )
    report.add(
        "JSON fleet: one read over loopback, gzip · identity (p50 of 3)",
        f"{p(took['gzip'], 50)} · {p(took['identity'], 50)}",
        f"identity {p(took['identity'], 50)}",
        f"{percentile(took['gzip'], 50) / percentile(took['identity'], 50):.3g}× identity",
    )
    report.add(
        "refresh answers: 200 · 304 · other",
        f"{fleet.statuses.get(200, 0)} · {fleet.statuses.get(304, 0)} · "
        f"{sum(v for k, v in fleet.statuses.items() if k not in (200, 304))}",
        f"JSON: {floor.statuses.get(200, 0)} · — · "
        f"{sum(v for k, v in floor.statuses.items() if k != 200)}",
    )
    report.add("first load of /fleet: HTML body decoded", f"{len(full.content):,} B")
    worst = max(loaded) if loaded else float("nan")
    report.add(
        f"/healthz with {slow:,} slow connections open: p50 · p99 · max",
        f"{p(loaded, 50)} · {p(loaded, 99)} · {fmt_ms(worst)}",
        f"no load: {p(quiet, 50)} · {p(quiet, 99)}",
        f"{percentile(loaded, 50) / percentile(quiet, 50):.1f}× p50",
        "max < 1 s",
        verdict(worst < 1.0),
    )
    report.add(
        "slow connections held open (after the ramp · at the end), cut by the server",
        f"{held:,} · {held_end:,}, {cut:,} cut",
        f"of {slow:,}",
    )
    report.add(
        "coordinator CPU · RSS under the slowloris",
        f"{loris_cpu:.1f} % of one core · {loris_rss:.0f} MiB",
    )
    report.note(
        f"{computers} computers: one enrolled and reporting (2 GPUs, {leases} leases, 10 "
        "waiting requests, 3 jobs), the others clones of its row. Each viewer is a thread "
        "with its own session and keep-alive connection; a window is "
        f"{seconds:.0f} s per kind ({len(fleet.durations_s)} page refreshes, "
        f"{len(floor.durations_s)} JSON reads), the JSON window first."
    )
    report.note(
        "Server CPU is the serve process's user+system time over the window's wall time; "
        "the clients run on the same machine and are not counted."
    )
    report.note(
        "Slowloris: each connection sends one byte of a 4 KiB request head every 2 s and "
        f"reconnects when cut (the server cuts heads at 10 s); {len(SLOW_SOURCES)} source "
        "addresses, each under the per-address cap. /healthz probes use a fresh connection "
        f"from 127.0.0.1 every 0.25 s ({len(loaded)} under load, {len(quiet)} without); a "
        "failed probe counts its time to fail."
    )
    report.note(
        "Before (issue 28, same shape of group): 18 MB per refresh rendered in 2.5–2.8 s, "
        "4 viewers 10.1 s p50 per refresh, one core busy, RSS 912 MiB."
    )
    report.finish(args.record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
