"""Web view refresh cost: the fleet page's live fragment for 100 computers, server side.

A real `rbroker-server serve` process (SQLite, one worker); one computer enrolled and
reporting (one GPU, two leases, a job), then cloned to `--computers` computers with their
state; a signed-in session. Measured: the server process's CPU time per refresh
(`GET /fleet/live`, what an open fleet page fetches every 5 s) beside the JSON fleet
read `GET /api/v1/fleet` of the same computers (the anchor), the client-side p50, and the
bytes of one refresh. Numbers are printed, never asserted.
"""

from __future__ import annotations

import re
import sys
import time

import httpx
import psutil
from _common import Report, fmt_ms, parser, percentile
from coordinator import clone_computers, enroll, start_server

REFRESH_S = 5.0


def _timed(
    client: httpx.Client, proc: psutil.Process, path: str, n: int, **kw: object
) -> tuple[list[float], float, str]:
    """(client durations, server CPU seconds per request, the last answer's body size: on
    the wire (gzipped where the server compresses) and decoded)."""
    client.get(path, **kw).raise_for_status()  # warm
    cpu0 = sum(proc.cpu_times()[:2])
    out, size = [], ""
    for _ in range(n):
        t0 = time.perf_counter()
        r = client.get(path, **kw)  # type: ignore[arg-type]
        r.read()
        size = f"{r.num_bytes_downloaded:,} B ({len(r.content):,} B decoded)"
        out.append(time.perf_counter() - t0)
        r.raise_for_status()
    return out, (sum(proc.cpu_times()[:2]) - cpu0) / n, size


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--computers", type=int, default=100, help="computers in the group (100)")
    p.add_argument("--requests", type=int, help="timed requests of each kind (200)")
    args = p.parse_args(argv)
    n = args.requests or (10 if args.quick else 200)
    report = Report(f"Web view: fleet page refresh, {args.computers} computers", args.quick)
    server = start_server(None)
    try:
        from rbroker_server.db import engine as db

        engine = db.make_engine(f"sqlite:///{(server.data_dir / 'rbroker-server.db').as_posix()}")
        (first,) = enroll(engine, 1, 0)
        with httpx.Client(base_url=server.url, timeout=60) as client:
            for body in first.bodies(range(1, 4)):
                client.post(
                    "/api/v1/reports", content=body, headers={"content-type": "application/json"}
                ).raise_for_status()
        clone_computers(engine, first.id, args.computers - 1)
        engine.dispose()
        proc = psutil.Process(server.proc.pid)
        with httpx.Client(base_url=server.url, timeout=60) as client:
            form = client.get("/signin").text
            csrf = re.search(r'name="csrf_token" value="([^"]+)"', form)
            assert csrf is not None
            client.post("/signin", data={"token": server.token, "csrf_token": csrf.group(1)})
            page, page_cpu, page_bytes = _timed(client, proc, "/fleet/live", n)
            _, full_cpu, full_bytes = _timed(client, proc, "/fleet", max(3, n // 10))
            auth = {"authorization": f"Bearer {server.token}"}
            api, api_cpu, api_bytes = _timed(client, proc, "/api/v1/fleet", n, headers=auth)
            met, met_cpu, met_bytes = _timed(client, proc, "/metrics", n, headers=auth)
    finally:
        server.stop()
    report.add(
        "refresh (fleet fragment): server CPU per refresh",
        fmt_ms(page_cpu),
        f"JSON fleet read {fmt_ms(api_cpu)}",
        f"{page_cpu / api_cpu:.1f}× the JSON read" if api_cpu else "n/a",
    )
    report.add(
        f"one open fleet page, refresh every {REFRESH_S:.0f} s: server CPU",
        f"{100 * page_cpu / REFRESH_S:.2f} % of one core",
        f"{REFRESH_S / page_cpu:,.0f} open pages per core" if page_cpu else "—",
    )
    report.add(
        "refresh (fleet fragment): client p50",
        fmt_ms(percentile(page, 50)),
        f"JSON read p50 {fmt_ms(percentile(api, 50))}",
    )
    report.add(
        "refresh (fleet fragment): body bytes on the wire (gzip)",
        page_bytes,
        f"JSON (not compressed) {api_bytes}",
    )
    report.add(
        "first load of /fleet: HTML body on the wire (gzip), server CPU",
        f"{full_bytes}, {fmt_ms(full_cpu)}",
        "plus app.css and app.js, cached an hour",
    )
    report.add(
        "/metrics scrape: server CPU, body bytes on the wire (gzip)",
        f"{fmt_ms(met_cpu)}, {met_bytes}",
        f"p50 {fmt_ms(percentile(met, 50))}",
    )
    report.note(
        f"{n} sequential requests of each kind over one keep-alive connection; server CPU "
        "is the serve process's user+system time over the run divided by the requests."
    )
    report.note(
        "Clones carry the reporting computer's state (1 GPU, 2 leases, 1 job); only the "
        "reporting computer has history points (the job rates read them)."
    )
    report.finish(args.record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
