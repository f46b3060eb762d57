"""Coordinator throughput (docs/architecture.md §7, §10): signed reports/s over HTTP, beside
the floor.

For each database (SQLite in a temporary data dir; PostgreSQL too when it answers at
`RBROKER_BENCH_PG_URL`, default postgresql+psycopg://postgres@127.0.0.1:5432/test, in a fresh
schema dropped afterwards), in one run:

1. `rbroker-server setup` and `serve` as a real process: one uvicorn worker, plain HTTP;
2. N simulated computers enrolled (one-time codes, Ed25519 keys); the load generator sends
   pre-signed envelopes, each once, with increasing seq per computer over keep-alive
   connections, each connection owning its own computers: applied reports/s and the
   server's CPU %. The generator is wrk (`bench/wrk_reports.lua`) when installed, else
   httpx client processes (a heavier client: on 2 cores it caps the figure);
3. what the report route calls (`ReportIngest.handle`: the sender cache, the group-commit
   writer) called in-process on the same database (no HTTP), each computer's reports in
   order and the computers at once, to split the HTTP cost from the ingest cost;
4. the floor, in-process: parse envelope + Ed25519 verify + payload decode (`ReportPayload`)
   + one SQLAlchemy Core insert per report (its own transaction) into a fresh table of the
   same database kind (SQLite WAL with the coordinator's pragmas);
5. PostgreSQL only: 2 (and 3) `serve` processes on different ports sharing the one schema,
   all driven at once: total reports/s and what each added process brings;
6. fleet read: `GET /api/v1/fleet` with a viewer token, 1 000 computers in the group (the
   reporting ones plus copies of one of them inserted directly), p50 / p99 client-side.

Figures 2-5 are measured in `--repeats` rounds (3), interleaved: each round measures every
kind once, the kind that goes first rotating; cells show the median and the range, and
every ratio is taken within one round. Signing happens before the timed window (a real
computer signs its own reports), so the client spends its CPU on HTTP only; it still shares
the machine's cores with the server.

    python bench/coordinator.py [--quick] [--record] [--computers 200] [--fleet 1000]
        [--connections 16] [--rounds 60] [--repeats 3] [--serve-processes 3]
        [--generator auto|wrk|httpx] [--seconds 30] [--no-pg]
"""

from __future__ import annotations

import json
import math
import os
import secrets
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import sqlalchemy as sa
from _common import (
    Report,
    fmt_ms,
    fmt_rate,
    median,
    parser,
    percentile,
    ratio,
    spread,
    verdict,
)
from _coord_fixture import (
    Computer,
    clone_computers,
    enroll,
    pg_available,
    pg_schema,
    start_server,
    start_sibling,
)
from _coord_load import GENERATORS, Load, pick_generator, plan_lanes, run_load

from rbroker.demo.coordinator import LocalCoordinator
from rbroker_protocol.reports import ReportPayload
from rbroker_protocol.signing import parse_envelope, public_key_b64, verify_report

TARGET_RATE = 2000.0
TARGET_SHARE = 0.50
TARGET_FLEET_P50_S = 0.200


# ---------------------------------------------------------------- in-process figures


def ingest_rate(engine: sa.Engine, per_computer: list[list[bytes]]) -> float:
    """Applied reports per second through what the report route calls
    (`ReportIngest.handle`), in-process, no HTTP: each computer's reports in order, the
    computers at once (as the HTTP load sends them)."""
    import anyio

    from rbroker_server.db.engine import utcnow
    from rbroker_server.reports.ingest import ReportIngest
    from rbroker_server.settings import Settings

    path = ReportIngest(engine, Settings())
    applied = 0

    async def one_computer(bodies: list[bytes]) -> None:
        nonlocal applied
        for body in bodies:
            ack = json.loads(await path.handle(body, utcnow()))
            applied += bool(ack["applied"])

    async def all_computers() -> None:
        async with anyio.create_task_group() as tg:
            for bodies in per_computer:
                tg.start_soon(one_computer, bodies)

    path.start()
    try:
        t0 = time.perf_counter()
        anyio.run(all_computers)
        return applied / (time.perf_counter() - t0)
    finally:
        path.close()


def floor_rate(engine: sa.Engine, bodies: list[bytes], keys: dict[str, str]) -> float:
    """Parse + verify + decode + one Core insert per report (own transaction), per second."""
    meta = sa.MetaData()
    table = sa.Table(
        f"bench_floor_{secrets.token_hex(4)}",
        meta,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("computer_id", sa.String(64), nullable=False),
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("received_at", sa.Float, nullable=False),
        sa.Column("payload", sa.Text, nullable=False),
    )
    meta.create_all(engine)
    try:
        insert = table.insert()
        t0 = time.perf_counter()
        for body in bodies:
            env = parse_envelope(body)
            data = verify_report(env, keys[env.computer_id])
            report = ReportPayload.from_bytes(data)
            with engine.begin() as conn:
                conn.execute(
                    insert,
                    {
                        "computer_id": env.computer_id,
                        "run_id": report.run_id,
                        "seq": env.seq,
                        "received_at": time.time(),
                        "payload": data.decode(),
                    },
                )
        return len(bodies) / (time.perf_counter() - t0)
    finally:
        meta.drop_all(engine)


def verify_only(bodies: list[bytes], keys: dict[str, str]) -> float:
    """Seconds per Ed25519 verify of a report (key loaded each time, as the server does)."""
    envs = [parse_envelope(b) for b in bodies]
    t0 = time.perf_counter()
    for env in envs:
        verify_report(env, keys[env.computer_id])
    return (time.perf_counter() - t0) / len(envs)


def fleet_reads(server: LocalCoordinator, n: int) -> tuple[list[float], int, int]:
    """Client-side durations of `n` fleet reads; also the computers listed and bytes."""
    out = []
    headers = {"authorization": f"Bearer {server.token}"}
    with httpx.Client(base_url=server.url, timeout=60) as client:
        resp = client.get("/api/v1/fleet", headers=headers)  # warm
        resp.raise_for_status()
        listed = len(resp.json()["computers"])
        for _ in range(n):
            t0 = time.perf_counter()
            resp = client.get("/api/v1/fleet", headers=headers)
            resp.read()
            out.append(time.perf_counter() - t0)
            resp.raise_for_status()
    return out, listed, len(resp.content)


# ---------------------------------------------------------------- one database


@dataclass
class Figures:
    """One database's rounds: `http[k]` the loads with k `serve` processes (one per round),
    `floor` / `ingest` reports/s per round (NaN where a round's ingest failed)."""

    http: dict[int, list[Load]] = field(default_factory=dict)
    floor: list[float] = field(default_factory=list)
    ingest: list[float] = field(default_factory=list)
    verify_s: float = math.nan
    fleet: list[float] = field(default_factory=list)
    fleet_listed: int = 0
    fleet_bytes: int = 0
    failures: list[str] = field(default_factory=list)


class Seqs:
    """The next unused report seq of the computers (every report of a run goes above)."""

    def __init__(self) -> None:
        self.next = 1

    def take(self, n: int) -> range:
        out = range(self.next, self.next + n)
        self.next += n
        return out


def kinds_of(processes: int) -> list[str]:
    """The measurements of one round: floor, HTTP with 1..`processes` servers, ingest."""
    return ["floor", *(f"http{k}" for k in range(1, processes + 1)), "ingest"]


def rotated(kinds: Sequence[str], round_no: int) -> list[str]:
    """`kinds` starting at `round_no` (mod their count): who goes first takes turns."""
    i = round_no % len(kinds)
    return [*kinds[i:], *kinds[:i]]


def run_backend(database_url: str | None, args: Any, processes: int) -> Figures:
    """All rounds on one database (None: SQLite in the data dir) with up to `processes`
    `serve` processes, then the fleet read."""
    from rbroker_server.db import engine as db
    from rbroker_server.settings import Settings

    server = start_server(database_url)
    servers = [server]
    engine = db.make_engine(Settings.load(server.data_dir).db_url)
    floor_engine = engine
    out = Figures()
    try:
        computers = enroll(engine, args.computers, 0)
        keys = {c.id: public_key_b64(c.key) for c in computers}
        per = max(1, args.inprocess // len(computers))
        seqs = Seqs()
        floor_bodies = [b for c in computers for b in c.bodies(range(1, per + 1))]
        if database_url is None:
            floor_engine = db.make_engine(f"sqlite:///{(server.data_dir / 'floor.db').as_posix()}")
        servers += [start_sibling(server) for _ in range(processes - 1)]
        kinds = kinds_of(processes)
        for r in range(args.repeats):
            for kind in rotated(kinds, r):
                measure(kind, out, servers, engine, floor_engine, computers, keys, seqs, args)
        out.verify_s = verify_only(floor_bodies, keys)
        clone_computers(engine, computers[0].id, args.fleet - len(computers))
        try:
            out.fleet, out.fleet_listed, out.fleet_bytes = fleet_reads(server, args.fleet_reads)
        except httpx.HTTPError as exc:  # report it, keep the other figures
            out.failures.append(f"fleet read failed: {exc!r}")
        return out
    finally:
        if floor_engine is not engine:
            floor_engine.dispose()
        engine.dispose()
        for s in reversed(servers):
            s.stop()


def measure(
    kind: str, out: Figures, servers: list[LocalCoordinator], engine: sa.Engine,
    floor_engine: sa.Engine, computers: list[Computer], keys: dict[str, str], seqs: Seqs,
    args: Any,
) -> None:  # fmt: skip
    """One measurement of a round (`kinds_of`), appended to `out`. Its reports are signed
    before its timed window, with seqs above every earlier one."""
    per = max(1, args.inprocess // len(computers))
    if kind == "floor":
        bodies = [b for c in computers for b in c.bodies(range(1, per + 1))]
        out.floor.append(floor_rate(floor_engine, bodies, keys))
    elif kind == "ingest":
        block = seqs.take(per)
        per_computer = [c.bodies(block) for c in computers]
        try:
            out.ingest.append(ingest_rate(engine, per_computer))
        except Exception as exc:  # the server's internals: report, keep the HTTP figures
            out.ingest.append(math.nan)
            out.failures.append(f"in-process ReportIngest.handle failed: {exc!r}")
    else:
        k = int(kind.removeprefix("http"))
        lanes = plan_lanes(servers[:k], computers, args.connections, seqs.take(args.rounds))
        load = run_load(args.generator, servers[:k], lanes, args.seconds, args.processes)
        out.http.setdefault(k, []).append(load)


# ---------------------------------------------------------------- the table


def _pct(v: float) -> str:
    return "n/a" if math.isnan(v) else f"{v * 100:.0f} %"


def _shares(values: Sequence[float], floors: Sequence[float]) -> list[float]:
    return [v / f if f else math.nan for v, f in zip(values, floors, strict=False)]


def add_rows(report: Report, name: str, f: Figures, args: Any) -> None:
    """The rows and notes of one database's figures."""
    target = name == "SQLite"
    one = f.http.get(1, [])
    rates = [ld.rate for ld in one]
    shares = _shares(rates, f.floor)
    floor_m = median(f.floor)
    gen = one[0].generator if one else args.generator
    report.add(
        f"{name}: signed reports/s over HTTP, one `serve` process ({gen})",
        spread(rates, fmt_rate),
        f"in-process floor {fmt_rate(floor_m)}",
        f"{spread(shares, _pct)} of floor",
        "≥ 2 000/s and ≥ 50 % of floor" if target else "— (beside SQLite)",
        verdict(median(rates) >= TARGET_RATE and median(shares) >= TARGET_SHARE) if target else "—",
    )
    cpu = [ld.server_cpu for ld in one]
    per_cpu = [ld.rate / (ld.server_cpu / 100) if ld.server_cpu > 0 else math.nan for ld in one]
    report.add(
        f"{name}: server process CPU during the HTTP load, % of one core",
        spread(cpu, lambda v: f"{v:.0f} %"),
        f"load generator ({gen}) {median([ld.client_cpu for ld in one]):.0f} %",
        f"{fmt_rate(median(per_cpu), '')} reports per CPU-second",
    )
    report.add(
        f"{name}: the report route's ingest in-process, no HTTP",
        spread(f.ingest, fmt_rate),
        f"floor {fmt_rate(floor_m)}",
        f"{spread(_shares(f.ingest, f.floor), _pct)} of floor",
    )
    if target:
        report.add(
            "calibration: in-process floor on SQLite",
            spread(f.floor, fmt_rate),
            "architecture.md §10's machine: ≈ 6 300/s",
            ratio(floor_m, 6300.0),
        )
    else:
        report.add(f"{name}: in-process floor", spread(f.floor, fmt_rate))
    for k in sorted(f.http):
        if k == 1:
            continue
        totals = [ld.rate for ld in f.http[k]]
        before = [ld.rate for ld in f.http.get(k - 1, [])]
        steps = [a - b for a, b in zip(totals, before, strict=False)]
        cpu_k = median([ld.server_cpu for ld in f.http[k]])
        report.add(
            f"{name}: {k} `serve` processes on one database, driven together ({gen})",
            spread(totals, fmt_rate),
            f"{k - 1} process{'es' if k > 2 else ''}: {fmt_rate(median(before))}",
            f"{spread(steps, lambda v: f'{v:+,.0f}/s')} for process {k}",
            "—",
            "—",
        )
        report.note(
            f"{name}, {k} `serve` processes: servers' CPU together {cpu_k:.0f} % of one core "
            f"(median); {os.cpu_count()} cores on this machine for the servers, "
            f"{name}, and the load generator together."
        )
    p50, p99 = percentile(f.fleet, 50), percentile(f.fleet, 99)
    report.add(
        f"{name}: fleet read, {f.fleet_listed:,} computers, p50 (p99 {fmt_ms(p99)})",
        fmt_ms(p50),
        f"{f.fleet_bytes / 2**20:.1f} MiB of JSON",
        "—",
        "< 200 ms" if target else "—",
        verdict(p50 < TARGET_FLEET_P50_S) if target else "—",
    )
    report.add(
        f"calibration ({name} run): Ed25519 verify (pynacl), one report",
        f"{f.verify_s * 1e6:,.0f} µs",
        "architecture.md §10's machine: ≈ 58 µs",
        ratio(f.verify_s, 58e-6),
    )
    loads = [ld for k in sorted(f.http) for ld in f.http[k]]
    failures = sorted({msg for ld in loads for msg in ld.failures} | set(f.failures))
    report.note(
        f"{name}: {len(loads)} HTTP runs of {args.rounds} reports per computer "
        f"({args.computers} computers, {len(loads) and loads[0].planned:,} reports, "
        f"{min(args.connections, args.computers)} connections): "
        f"{sum(ld.applied for ld in loads):,} applied, "
        f"{sum(ld.not_applied for ld in loads):,} not applied, "
        f"{sum(ld.errors for ld in loads):,} errors; median window "
        f"{median([ld.seconds for ld in loads]):.2f} s."
        + (f" Failures: {'; '.join(failures)}." if failures else "")
    )


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--computers", type=int, help="reporting computers (200)")
    p.add_argument("--fleet", type=int, help="computers in the group for the fleet read (1000)")
    p.add_argument("--connections", type=int, help="HTTP connections of the load (16)")
    p.add_argument("--rounds", type=int, help="reports per computer in one HTTP run (60)")
    p.add_argument("--repeats", type=int, help="interleaved rounds of every figure (3)")
    p.add_argument("--serve-processes", type=int, help="most `serve` processes on PostgreSQL (3)")
    p.add_argument("--generator", choices=GENERATORS, default="auto",
                   help="HTTP load generator (auto: wrk when installed, else httpx)")  # fmt: skip
    p.add_argument("--processes", type=int, help="httpx client processes (fallback; 4)")
    p.add_argument("--seconds", type=float, help="longest window of one HTTP run (30)")
    p.add_argument("--no-pg", action="store_true", help="skip PostgreSQL")
    args = p.parse_args(argv)
    q = args.quick
    args.computers = args.computers or (20 if q else 200)
    args.fleet = args.fleet or (60 if q else 1000)
    args.connections = args.connections or (4 if q else 16)
    args.rounds = args.rounds or (10 if q else 60)
    args.repeats = args.repeats or 3
    args.serve_processes = args.serve_processes or (2 if q else 3)
    args.processes = args.processes or (2 if q else 4)
    args.seconds = args.seconds or (10.0 if q else 30.0)
    args.inprocess = 200 if q else 1000
    args.fleet_reads = 5 if q else 15
    if min(args.computers, args.connections, args.rounds, args.repeats) < 1:
        p.error("--computers, --connections, --rounds and --repeats must be at least 1")
    try:
        args.generator, why = pick_generator(args.generator)
    except ValueError as exc:
        p.error(str(exc))

    report = Report("Coordinator: signed reports over HTTP, fleet read", q)
    figures: dict[str, Figures] = {}
    try:
        figures["SQLite"] = run_backend(None, args, 1)
    except Exception as exc:  # report what failed instead of a traceback
        report.note(f"SQLite run failed: {exc!r}")
    no_pg = "--no-pg was given" if args.no_pg else pg_available()
    if no_pg is None:
        try:
            with pg_schema() as url:
                figures["PostgreSQL"] = run_backend(url, args, max(1, args.serve_processes))
        except Exception as exc:
            report.note(f"PostgreSQL run failed: {exc!r}")

    for name, f in figures.items():
        add_rows(report, name, f, args)
    if no_pg:
        report.note(f"PostgreSQL figures skipped: {no_pg}.")
    report.note(
        f"Load generator: {args.generator} ({why}). "
        + (
            "wrk runs one thread per connection (bench/wrk_reports.lua); each sends its "
            "pre-built requests once, the next after the answer, and counts the answers. "
            if args.generator == "wrk"
            else f"{args.processes} httpx client processes, one coroutine per connection. "
        )
        + f"Rounds: {args.repeats}, interleaved (floor, HTTP, ingest taking turns to go "
        "first); cells: median (min–max, n); ratios taken within a round. The load "
        "generator shares the machine's cores with the server under test."
    )
    report.note(
        "Floor: parse envelope + Ed25519 verify (pynacl) + `ReportPayload` decode + one "
        "SQLAlchemy Core insert per report in its own transaction, one thread, into a fresh "
        "table of the same database kind (SQLite: WAL, synchronous=NORMAL, as the coordinator)."
    )
    report.note(
        "Server: `rbroker-server serve` (uvicorn, one worker, plain HTTP; "
        + ("uvloop" if _has("uvloop") else "asyncio loop")
        + ", "
        + ("httptools" if _has("httptools") else "h11 parser")
        + "). Several `serve` processes share one data dir and database, each on its own "
        "port; the idle ones stay up while fewer are driven."
    )
    report.finish(args.record)
    return 0 if figures else 1


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


if __name__ == "__main__":
    sys.exit(main())
