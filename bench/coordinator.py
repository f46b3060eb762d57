"""Coordinator throughput (docs/architecture.md §7, §10): signed reports/s over HTTP, beside
the floor.

For each database (SQLite in a temporary data dir; PostgreSQL too when it answers at
`RBROKER_BENCH_PG_URL`, default postgresql+psycopg://postgres@127.0.0.1:5432/test, in a fresh
schema dropped afterwards), in one run:

1. `rbroker-server setup` and `serve` as a real process: one uvicorn worker, plain HTTP;
2. N simulated computers enrolled (one-time codes, Ed25519 keys); client processes post
   pre-signed envelopes with increasing seq per computer (httpx, keep-alive connections,
   several in flight per process): applied reports/s and the server's CPU %;
3. the server's own `ingest()` called in-process on the same database (no HTTP), to split
   the HTTP cost from the ingest cost;
4. the floor, in-process: parse envelope + Ed25519 verify + payload decode (`ReportPayload`)
   + one SQLAlchemy Core insert per report (its own transaction) into a fresh table of the
   same database kind (SQLite WAL with the coordinator's pragmas);
5. fleet read: `GET /api/v1/fleet` with a viewer token, 1 000 computers in the group (the
   reporting ones plus copies of one of them inserted directly), p50 / p99 client-side.

Signing happens before the timed window (a real computer signs its own reports), so the
clients spend their CPU on HTTP only; they still share the machine's cores with the server.

    python bench/coordinator.py [--quick] [--record] [--computers 200] [--fleet 1000]
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import os
import secrets
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
import nacl.signing
import psutil
import sqlalchemy as sa
from _common import (
    Report,
    StartGate,
    fmt_ms,
    fmt_rate,
    parser,
    percentile,
    ratio,
    short_tmp,
    verdict,
)

from rbroker.demo.coordinator import LocalCoordinator
from rbroker_protocol.reports import GpuReport, JobSnapshot, LeaseReport, ReportPayload
from rbroker_protocol.signing import (
    encode_envelope,
    parse_envelope,
    public_key_b64,
    sign_report,
    verify_report,
)

PG_URL = os.environ.get("RBROKER_BENCH_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
TARGET_RATE = 2000.0
TARGET_SHARE = 0.40
TARGET_FLEET_P50_S = 0.200
GPU = "GPU-5a1e0000-0000-0000-0000-000000000001"

_ctx = mp.get_context("fork")


# ---------------------------------------------------------------- reports


def payload(name: str, run_id: str, seq: int) -> bytes:
    """A realistic report: one GPU, two leases, one job (≈ 1.3 KB of JSON)."""
    leases = [
        LeaseReport(
            lease_id=f"lease-{seq:06x}{i:06x}",
            gpu_uuids=[GPU],
            granted_mib=4096,
            owner="alice",
            project="vision",
            session=f"run-{i}",
            purpose="fine-tune a ViT-B on the lab corpus",
            granted_at=time.time() - 60,
            expires_in_s=25.0,
            observed_mib={GPU: 3900},
        )
        for i in range(2)
    ]
    return ReportPayload(
        computer_name=name,
        broker_version="0.1.0",
        telemetry_source="simulated",
        run_id=run_id,
        generated_at=time.time(),
        gpus=[
            GpuReport(
                uuid=GPU,
                index=0,
                name="Simulated RTX 4090",
                total_mib=24576,
                headroom_mib=1229,
                device_used_mib=8300,
                outstanding_mib=392,
                available_mib=14655,
                leased_in_use_mib=7800,
                other_in_use_mib=500,
            )
        ],
        leases=leases,
        jobs=[
            JobSnapshot(
                job_id="job-1",
                project="vision",
                purpose="embed corpus",
                handler="embed.encode_batch",
                workers=4,
                total_items=100_000,
                completed_items=seq * 100,
            )
        ],
    ).to_bytes()


@dataclass
class Computer:
    id: str
    name: str
    seed: bytes
    run_id: str = "run-bench"

    @property
    def key(self) -> nacl.signing.SigningKey:
        return nacl.signing.SigningKey(self.seed)

    def bodies(self, seqs: range) -> list[bytes]:
        key = self.key
        return [
            encode_envelope(
                sign_report(key, self.id, self.run_id, seq, payload(self.name, self.run_id, seq))
            )
            for seq in seqs
        ]


# ---------------------------------------------------------------- the server process


def start_server(database_url: str | None) -> LocalCoordinator:
    """`rbroker-server setup` + `serve` (a process: one uvicorn worker), through the shared
    local-coordinator helper."""
    data_dir = short_tmp("rbbs-") / "server"
    server = LocalCoordinator.setup(data_dir, database_url=database_url or "")
    server.log_name = "serve.log"
    server.start(timeout_s=60)
    return server


def enroll(engine: sa.Engine, n: int, first: int) -> list[Computer]:
    """Enroll `n` computers in the setup group through the server's own enroll service."""
    from rbroker_server.admin import service as admin
    from rbroker_server.enroll import service as enroll_service
    from rbroker_server.enroll.schema import EnrollRequest

    out = []
    for i in range(first, first + n):
        seed = secrets.token_bytes(32)
        key = nacl.signing.SigningKey(seed)
        code = admin.create_enroll_code(engine, "default", 3600).text
        name = f"bench-{i:05d}"
        resp = enroll_service.enroll(
            engine, EnrollRequest(code=code, name=name, public_key=public_key_b64(key))
        )
        out.append(Computer(resp.computer_id, name, seed))
    return out


def clone_computers(engine: sa.Engine, source_id: str, n: int) -> None:
    """Add `n` computers to the group as copies of `source_id` (its last report, state and
    freshness), with their own ids, names and keys: the fleet read's 1 000 computers without
    enrolling and reporting each (not part of any timed figure)."""
    if n <= 0:
        return
    from rbroker_server.models import Computer as ComputerRow

    table = ComputerRow.__table__  # type: ignore[attr-defined]
    with engine.begin() as conn:
        row = conn.execute(sa.select(table).where(table.c.id == source_id)).mappings().one()
        rows = []
        for i in range(n):
            key = nacl.signing.SigningKey.generate()
            rows.append(
                {
                    **row,
                    "id": f"c_clone{i:06d}",
                    "name": f"bench-clone-{i:05d}",
                    "reported_name": f"bench-clone-{i:05d}",
                    "public_key": public_key_b64(key),
                }
            )
        conn.execute(sa.insert(table), rows)


# ---------------------------------------------------------------- HTTP load


def _sender(
    url: str,
    computers: list[Computer],
    rounds: int,
    concurrency: int,
    gate: StartGate,
    limit_s: float,
    q: Any,
) -> None:
    """Post `rounds` pre-signed reports of each computer, in seq order per computer, until
    done or `limit_s` after the common start."""
    arrived = False
    try:
        bodies = {c.id: c.bodies(range(1, rounds + 1)) for c in computers}
        lanes = [computers[i::concurrency] for i in range(concurrency)]
        counts = {"applied": 0, "not_applied": 0, "errors": 0}
        end_at = 0.0

        async def lane(client: httpx.AsyncClient, mine: list[Computer]) -> None:
            for r in range(rounds):
                for c in mine:
                    if time.monotonic() >= end_at:
                        return
                    resp = await client.post(
                        "/api/v1/reports",
                        content=bodies[c.id][r],
                        headers={"content-type": "application/json"},
                    )
                    if resp.status_code != 200:
                        counts["errors"] += 1
                    elif resp.json().get("applied"):
                        counts["applied"] += 1
                    else:
                        counts["not_applied"] += 1

        async def run() -> float:
            nonlocal arrived, end_at
            limits = httpx.Limits(
                max_connections=concurrency, max_keepalive_connections=concurrency
            )
            async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as client:
                for _ in range(concurrency):  # connections open before the start
                    await client.get("/healthz")
                arrived = True
                end_at = gate.arrive() + limit_s
                t0 = time.process_time()
                await asyncio.gather(*(lane(client, m) for m in lanes if m))
                cpu = time.process_time() - t0
            q.put((counts, time.monotonic(), cpu, ""))
            return cpu

        asyncio.run(run())
    except Exception as exc:  # report, never hang the parent
        if not arrived:
            gate.arrive(ok=False)
        q.put(({"applied": 0, "not_applied": 0, "errors": 1}, time.monotonic(), 0.0, repr(exc)))


@dataclass
class Load:
    rate: float
    applied: int
    not_applied: int
    errors: int
    seconds: float
    server_cpu: float
    client_cpu: float
    failures: list[str]


def http_load(
    server: LocalCoordinator,
    computers: list[Computer],
    processes: int,
    concurrency: int,
    rounds: int,
    limit_s: float,
) -> Load:
    q = _ctx.Queue()
    gate = StartGate(_ctx)
    procs = [
        _ctx.Process(
            target=_sender,
            args=(server.url, computers[i::processes], rounds, concurrency, gate, limit_s, q),
            daemon=True,
        )
        for i in range(processes)
    ]
    for p in procs:
        p.start()
    assert server.proc is not None
    sproc = psutil.Process(server.proc.pid)
    start_at = gate.open(processes)
    c0 = sum(sproc.cpu_times()[:2])
    results = [q.get(timeout=limit_s + 300) for _ in procs]
    c1 = sum(sproc.cpu_times()[:2])
    for p in procs:
        p.join(10)
    ended = max(r[1] for r in results)
    seconds = max(1e-9, ended - start_at)
    applied = sum(r[0]["applied"] for r in results)
    return Load(
        rate=applied / seconds,
        applied=applied,
        not_applied=sum(r[0]["not_applied"] for r in results),
        errors=sum(r[0]["errors"] for r in results),
        seconds=seconds,
        server_cpu=(c1 - c0) / seconds * 100,
        client_cpu=sum(r[2] for r in results) / seconds * 100,
        failures=[r[3] for r in results if r[3]],
    )


# ---------------------------------------------------------------- in-process figures


def ingest_rate(engine: sa.Engine, bodies: list[bytes]) -> float:
    """The server's own `ingest()` per second, one thread, no HTTP."""
    from rbroker_server.reports import service
    from rbroker_server.settings import Settings

    settings = Settings()
    t0 = time.perf_counter()
    applied = sum(1 for b in bodies if service.ingest(engine, settings, b).applied)
    return applied / (time.perf_counter() - t0)


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


# ---------------------------------------------------------------- databases


@contextlib.contextmanager
def pg_schema() -> Iterator[str]:
    """A URL into a fresh PostgreSQL schema (dropped afterwards)."""
    schema = f"rbbench_{os.getpid()}_{secrets.token_hex(3)}"
    admin = sa.create_engine(PG_URL)
    try:
        with admin.begin() as conn:
            conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
        sep = "&" if "?" in PG_URL else "?"
        yield f"{PG_URL}{sep}options={quote(f'-csearch_path={schema}')}"
    finally:
        with admin.begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        admin.dispose()


def pg_available() -> str | None:
    try:
        engine = sa.create_engine(PG_URL, connect_args={"connect_timeout": 3})
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
        engine.dispose()
    except Exception as exc:  # any failure means no PostgreSQL figures
        return f"PostgreSQL does not answer at {PG_URL} ({exc.__class__.__name__})"
    return None


@dataclass
class Figures:
    load: Load
    ingest: float
    floor: float
    verify_s: float
    fleet: list[float]
    fleet_listed: int
    fleet_bytes: int
    failures: list[str]


def run_backend(database_url: str | None, args: Any) -> Figures:
    from rbroker_server import db
    from rbroker_server.settings import Settings

    server = start_server(database_url)
    engine = db.make_engine(Settings.load(server.data_dir).db_url)
    failures: list[str] = []
    try:
        computers = enroll(engine, args.computers, 0)
        load = http_load(
            server, computers, args.processes, args.concurrency, args.rounds, args.seconds
        )
        keys = {c.id: public_key_b64(c.key) for c in computers}
        per = max(1, args.inprocess // len(computers))
        base = args.rounds + 10
        bodies = [b for c in computers for b in c.bodies(range(base, base + per))]
        ingest = ingest_rate(engine, bodies)
        fresh = [b for c in computers for b in c.bodies(range(1, per + 1))]
        floor_engine = (
            db.make_engine(f"sqlite:///{(server.data_dir / 'floor.db').as_posix()}")
            if database_url is None
            else engine
        )
        floor = floor_rate(floor_engine, fresh, keys)
        verify_s = verify_only(fresh, keys)
        clone_computers(engine, computers[0].id, args.fleet - len(computers))
        try:
            fleet, listed, size = fleet_reads(server, args.fleet_reads)
        except httpx.HTTPError as exc:  # report it, keep the other figures
            fleet, listed, size = [], 0, 0
            failures.append(f"fleet read failed: {exc!r}")
        if floor_engine is not engine:
            floor_engine.dispose()
        return Figures(load, ingest, floor, verify_s, fleet, listed, size, failures)
    finally:
        engine.dispose()
        server.stop()


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--computers", type=int, help="reporting computers (200)")
    p.add_argument("--fleet", type=int, help="computers in the group for the fleet read (1000)")
    p.add_argument("--processes", type=int, help="client processes (4)")
    p.add_argument("--concurrency", type=int, help="requests in flight per process (8)")
    p.add_argument("--seconds", type=float, help="longest HTTP load window (10)")
    p.add_argument("--no-pg", action="store_true", help="skip PostgreSQL")
    args = p.parse_args(argv)
    q = args.quick
    args.computers = args.computers or (20 if q else 200)
    args.fleet = args.fleet or (60 if q else 1000)
    args.processes = args.processes or (2 if q else 4)
    args.concurrency = args.concurrency or (4 if q else 8)
    args.seconds = args.seconds or (2.0 if q else 10.0)
    args.rounds = 10 if q else 60
    args.inprocess = 200 if q else 1000
    args.fleet_reads = 5 if q else 15

    report = Report("Coordinator: signed reports over HTTP, fleet read", q)
    figures: dict[str, Figures] = {}
    try:
        figures["SQLite"] = run_backend(None, args)
    except Exception as exc:  # report what failed instead of a traceback
        report.note(f"SQLite run failed: {exc!r}")
    no_pg = "--no-pg was given" if args.no_pg else pg_available()
    if no_pg is None:
        try:
            with pg_schema() as url:
                figures["PostgreSQL"] = run_backend(url, args)
        except Exception as exc:
            report.note(f"PostgreSQL run failed: {exc!r}")

    for name, f in figures.items():
        share = f.load.rate / f.floor if f.floor else float("nan")
        target = name == "SQLite"
        report.add(
            f"{name}: signed reports/s over HTTP, one worker",
            fmt_rate(f.load.rate),
            f"in-process floor {fmt_rate(f.floor)}",
            f"{share * 100:.0f} % of floor",
            "≥ 2 000/s and ≥ 40 % of floor" if target else "— (beside SQLite)",
            verdict(f.load.rate >= TARGET_RATE and share >= TARGET_SHARE) if target else "—",
        )
        report.add(
            f"{name}: server's ingest() in-process, no HTTP",
            fmt_rate(f.ingest),
            f"floor {fmt_rate(f.floor)}",
            f"{f.ingest / f.floor * 100:.0f} % of floor" if f.floor else "n/a",
        )
        report.add(
            f"{name}: server CPU during the HTTP load",
            f"{f.load.server_cpu:.0f} % of one core",
            f"clients {f.load.client_cpu:.0f} %",
            f"{f.load.rate / max(f.load.server_cpu / 100, 1e-9):,.0f} reports per CPU-second",
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
        if name == "SQLite":
            report.add(
                "calibration: in-process floor on SQLite",
                fmt_rate(f.floor),
                "architecture.md §10's machine: ≈ 6 300/s",
                ratio(f.floor, 6300.0),
            )
        report.note(
            f"{name}: {f.load.applied:,} reports applied in {f.load.seconds:.1f} s "
            f"({f.load.not_applied} not applied, {f.load.errors} errors) from "
            f"{args.computers} computers, {args.processes} client processes × "
            f"{args.concurrency} in flight."
            + (f" Client failures: {'; '.join(f.load.failures)}" if f.load.failures else "")
            + (f" {'; '.join(f.failures)}." if f.failures else "")
        )
    if no_pg:
        report.note(f"PostgreSQL figures skipped: {no_pg}.")
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
        + ")."
    )
    report.finish(args.record)
    return 0 if figures else 1


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


if __name__ == "__main__":
    sys.exit(main())
