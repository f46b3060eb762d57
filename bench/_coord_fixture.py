"""The coordinator benchmark's fixture: realistic signed reports, enrolled computers, the
`rbroker-server serve` processes (one, or several on one database) and a fresh PostgreSQL
schema. Nothing here is timed."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import quote

import nacl.signing
import sqlalchemy as sa
from _common import short_tmp
from tests.fakes.reports import GPU_A, gpu_report, payload, signed_body

from rbroker.demo.coordinator import LocalCoordinator, free_port
from rbroker_protocol.reports import JobSnapshot, LeaseReport
from rbroker_protocol.signing import public_key_b64

PG_URL = os.environ.get("RBROKER_BENCH_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def realistic_payload(name: str, run_id: str, seq: int) -> bytes:
    """A realistic report: one GPU, two leases, one job (≈ 1.3 KB of JSON)."""
    leases = [
        LeaseReport(
            lease_id=f"lease-{seq:06x}{i:06x}",
            gpu_uuids=[GPU_A],
            granted_mib=4096,
            owner="alice",
            project="vision",
            session=f"run-{i}",
            purpose="fine-tune a ViT-B on the lab corpus",
            granted_at=time.time() - 60,
            expires_in_s=25.0,
            observed_mib={GPU_A: 3900},
        )
        for i in range(2)
    ]
    return payload(
        name,
        run_id,
        gpus=[gpu_report(leased_in_use_mib=7800, other_in_use_mib=500, outstanding_mib=392)],
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
        key, run_id = self.key, self.run_id
        return [
            signed_body(key, self.id, run_id, seq, realistic_payload(self.name, run_id, seq))
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


def start_sibling(server: LocalCoordinator) -> LocalCoordinator:
    """Another `rbroker-server serve` process of `server`'s data dir (so on its database)
    on a free port of its own; stop it with `.stop()`.

    Raises:
        rbroker.demo.coordinator.CoordinatorError: it exited or did not answer in 60 s.
    """
    port = free_port()
    sibling = dataclasses.replace(server, port=port, proc=None, log_name=f"serve-{port}.log")
    sibling.start(timeout_s=60)
    return sibling


def enroll(engine: sa.Engine, n: int, first: int) -> list[Computer]:
    """Enroll `n` computers in the setup group through the server's own enroll service."""
    from rbroker_protocol.enroll import EnrollRequest
    from rbroker_server.admin import operations as admin
    from rbroker_server.enroll import service as enroll_service

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
    from rbroker_server.db.models import Computer as ComputerRow

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
    """None when PostgreSQL answers at `PG_URL`, else why not (one line)."""
    try:
        engine = sa.create_engine(PG_URL, connect_args={"connect_timeout": 3})
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
        engine.dispose()
    except Exception as exc:  # any failure means no PostgreSQL figures
        return f"PostgreSQL does not answer at {PG_URL} ({exc.__class__.__name__})"
    return None
