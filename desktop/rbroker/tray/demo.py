"""A demo broker with real lease holders, and a demo fleet: what the screenshots show.

No Qt here. `DemoBroker` runs a simulated broker in-process (as the tray does) and starts
worker processes that hold leases and "use" part of them through `sim.allocate`, two that
wait for room and two that run parallel jobs, so every part of the window has live data.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

from rbroker._exceptions import RBrokerError
from rbroker.localapi.client import Client
from rbroker.tray.embedded import EmbeddedBroker

GPU0 = "GPU-5a1e0000-0000-0000-0000-000000000001"
GPU1 = "GPU-5a1e0000-0000-0000-0000-000000000002"

SCENARIO = f"""
[[gpu]]
uuid = "{GPU0}"
name = "Simulated RTX 4090"
total_mib = 24576
used_mib = 1800

[[gpu]]
uuid = "{GPU1}"
name = "Simulated RTX A6000"
total_mib = 49140
used_mib = 6000
"""

# (mib, gpu, project, session, purpose, MiB it allocates once granted)
HOLDERS: list[tuple[int, str, str, str, str, int]] = [
    (8192, GPU0, "vision", "vit-b-run-42", "fine-tune ViT-B/16 on product photos", 7400),
    (6144, GPU0, "nlp", "embed-tickets", "embed support tickets (bge-large)", 3100),
    (12288, GPU1, "speech", "whisper-eval", "evaluate Whisper large-v3 on call audio", 11800),
    (16384, GPU1, "vision", "sweep-lr-3e-4", "learning-rate sweep, trial 7", 2048),
]
WAITERS: list[tuple[int, str | None, str, str, str]] = [
    (20480, None, "genai", "sdxl-lora", "SDXL LoRA fine-tune"),
    (9000, GPU0, "nlp", "llama-8b-eval", "Llama 3 8B evaluation"),
]

WORKER = textwrap.dedent(
    """
    import sys, time, rbroker
    sock, mib, gpu, project, session, purpose, use = sys.argv[1:8]
    with rbroker.lease(int(mib), gpu_uuid=gpu or None, project=project, session=session,
                       purpose=purpose, wait_s=3600, socket=sock) as lease:
        c = rbroker.Client(sock)
        if int(use):
            c.sim_allocate(int(use), lease.gpu_uuid)
        print("granted", flush=True)
        time.sleep(3600)
    """
)


# (project, purpose, handler, total_items, workers, items per chunk, chunks at once)
JOBS: list[tuple[str, str, str, int, int, int, int]] = [
    ("nlp", "embed support tickets", "embed.encode_batch", 240_000, 4, 4_800, 27),
    ("vision", "caption product photos", "caption.run", 80_000, 2, 1_450, 10),
]

JOB_WORKER = textwrap.dedent(
    """
    import sys, time, rbroker
    sock, project, purpose, handler, total, workers, size, burst = sys.argv[1:9]
    total, size, burst = int(total), int(size), int(burst)
    with rbroker.job(project=project, purpose=purpose, handler=handler, total_items=total,
                     workers=int(workers), socket=sock) as job:
        n = 0
        while (n + 1) * size <= total:
            job.report(f"chunk-{n}", completed=size - (n % 9 == 4), failed=int(n % 9 == 4))
            n += 1
            time.sleep(0.01 if n < burst else 8.0)
        time.sleep(3600)
    """
)


class DemoBroker:
    """A simulated broker on two GPUs with four lease holders, two waiting requests and two
    parallel jobs reporting progress."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root or Path(tempfile.mkdtemp(prefix="rbdemo-"))
        self.socket = str(self.root / "broker.sock")
        self.procs: list[subprocess.Popen[bytes]] = []
        self.broker: EmbeddedBroker | None = None

    def start(self, timeout_s: float = 30.0) -> None:
        from rbroker.host import make_config

        scenario = self.root / "scenario.toml"
        scenario.write_text(SCENARIO)
        config = make_config(self.socket, self.root / "data", True, scenario, None)
        self.broker = EmbeddedBroker(config)
        self.broker.start()
        if not self.broker.wait_ready(timeout_s):
            raise RuntimeError(f"demo broker did not start: {self.broker.error}")
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        for mib, gpu, project, session, purpose, use in HOLDERS:
            self._spawn([str(mib), gpu, project, session, purpose, str(use)], env)
            n = len(self.procs)
            self._wait(lambda n=n: self._count("leases") >= n, timeout_s)
        for mib, gpu_or_none, project, session, purpose in WAITERS:
            self._spawn([str(mib), gpu_or_none or "", project, session, purpose, "0"], env)
        self._wait(lambda: self._count("queue") >= len(WAITERS), timeout_s)
        for job in JOBS:
            self._spawn_script(JOB_WORKER, [str(x) for x in job], env)
        self._wait(self._jobs_running, timeout_s)
        # let the broker see the holders' allocations in a fresh sample
        self._wait(self._allocations_seen, timeout_s)

    def _spawn(self, args: list[str], env: dict[str, str]) -> None:
        self._spawn_script(WORKER, args, env)

    def _spawn_script(self, script: str, args: list[str], env: dict[str, str]) -> None:
        self.procs.append(
            subprocess.Popen(
                [sys.executable, "-c", script, self.socket, *args],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )

    def _count(self, what: str) -> int:
        try:
            with Client(self.socket, timeout_s=5) as c:
                return len(c.leases()[what])
        except RBrokerError:
            return 0

    def _jobs_running(self) -> bool:
        try:
            with Client(self.socket, timeout_s=5) as c:
                jobs = c.jobs()
        except RBrokerError:
            return False
        done = {j.get("purpose"): int(j.get("completed_items") or 0) for j in jobs}
        return all(
            done.get(purpose, 0) >= size * (burst - 1) for _, purpose, _, _, _, size, burst in JOBS
        )

    def _allocations_seen(self) -> bool:
        with Client(self.socket, timeout_s=5) as c:
            used = sum(int(g.get("leased_in_use_mib") or 0) for g in c.gpus())
        return used >= sum(h[5] for h in HOLDERS)

    @staticmethod
    def _wait(pred: Any, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not pred():
            if time.monotonic() > deadline:
                raise RuntimeError("demo broker did not reach its state in time")
            time.sleep(0.05)

    def stop(self) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        if self.broker is not None:
            self.broker.stop()


def _gpu(
    index: int,
    name: str,
    total: int,
    leased: int,
    outstanding: int,
    others: int,
    telemetry: str = "ok",
    uuid_tail: int = 0,
) -> dict[str, Any]:
    headroom = max(512, -(-total * 5 // 100))
    available = max(0, total - headroom - leased - others - outstanding)
    return {
        "uuid": f"GPU-d3m0{uuid_tail:04d}-0000-0000-0000-{index + 1:012d}",
        "index": index,
        "name": name,
        "telemetry": telemetry,
        "telemetry_reason": "" if telemetry == "ok" else "NVML call timed out",
        "total_mib": total,
        "headroom_mib": headroom,
        "device_used_mib": leased + others,
        "outstanding_mib": outstanding,
        "available_mib": available,
        "leased_in_use_mib": leased,
        "other_in_use_mib": others,
        "leases": 1 if leased or outstanding else 0,
        "waiting": 0,
    }


def _lease(
    owner: str,
    project: str,
    session: str,
    purpose: str,
    mib: int,
    gpu: str,
    age_s: float,
    now: float,
) -> dict[str, Any]:
    return {
        "lease_id": f"lease-{abs(hash((owner, session))) % 16**12:012x}",
        "owner": owner,
        "project": project,
        "session": session,
        "purpose": purpose,
        "granted_mib": mib,
        "gpu_uuid": gpu,
        "gpu_uuids": [gpu],
        "state": "active",
        "granted_at": now - age_s,
        "expires_in_s": 27.0,
    }


def _job(
    job_id: str,
    project: str,
    purpose: str,
    handler: str,
    total: int | None,
    done: int,
    failed: int,
    workers: int,
    state: str = "running",
) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "project": project,
        "purpose": purpose,
        "handler": handler,
        "total_items": total,
        "completed_items": done,
        "failed_items": failed,
        "workers": workers,
        "state": state,
    }


def demo_fleet(now: float | None = None) -> list[dict[str, Any]]:
    """A small group of computers in every freshness state (for demos and screenshots)."""
    now = time.time() if now is None else now
    ws1 = [
        _gpu(0, "RTX 4090", 24576, 15400, 0, 1800, uuid_tail=1),
        _gpu(1, "RTX 4090", 24576, 6100, 2000, 900, uuid_tail=1),
    ]
    render = [_gpu(0, "RTX A6000", 49140, 44100, 0, 2500, uuid_tail=2)]
    box = [_gpu(i, "A100 80GB", 81920, 30000 * (i % 2), 0, 400, uuid_tail=3) for i in range(4)]
    laptop = [_gpu(0, "RTX 3070 Laptop", 8192, 0, 0, 900, uuid_tail=4)]
    return [
        {
            "computer_id": "c-7f3a",
            "name": "lab-ws-01",
            "freshness": "online",
            "last_seen_age_s": 3.0,
            "gpus": ws1,
            "leases": [
                _lease(
                    "maria",
                    "vision",
                    "vit-b-run-42",
                    "fine-tune ViT-B/16",
                    16384,
                    ws1[0]["uuid"],
                    5400,
                    now,
                ),
                _lease(
                    "tom",
                    "nlp",
                    "embed-tickets",
                    "embed support tickets",
                    8192,
                    ws1[1]["uuid"],
                    1260,
                    now,
                ),
            ],
            "jobs": [
                _job(
                    "job-1",
                    "nlp",
                    "embed support tickets",
                    "embed.encode_batch",
                    240_000,
                    151_200,
                    312,
                    4,
                ),
                _job(
                    "job-2", "vision", "caption product photos", "caption.run", 80_000, 14_500, 0, 2
                ),
            ],
        },
        {
            "computer_id": "c-19bd",
            "name": "render-02",
            "freshness": "online",
            "last_seen_age_s": 1.0,
            "gpus": render,
            "leases": [
                _lease(
                    "li",
                    "genai",
                    "sdxl-lora",
                    "SDXL LoRA fine-tune",
                    45056,
                    render[0]["uuid"],
                    9000,
                    now,
                ),
            ],
            "jobs": [],
        },
        {
            "computer_id": "c-a0c2",
            "name": "gpu-box-03",
            "freshness": "stale",
            "last_seen_age_s": 7 * 60 + 12,
            "gpus": box,
            "leases": [
                _lease(
                    "sam",
                    "speech",
                    "whisper-eval",
                    "evaluate Whisper large-v3",
                    32768,
                    box[1]["uuid"],
                    7200,
                    now,
                ),
                _lease(
                    "sam",
                    "speech",
                    "whisper-eval-2",
                    "evaluate Whisper medium",
                    32768,
                    box[3]["uuid"],
                    7100,
                    now,
                ),
            ],
            "jobs": [
                _job(
                    "job-3",
                    "speech",
                    "transcribe call archive",
                    "asr.transcribe",
                    12_000,
                    11_400,
                    45,
                    8,
                ),
            ],
        },
        {
            "computer_id": "c-55e1",
            "name": "laptop-anna",
            "freshness": "offline",
            "last_seen_age_s": 3 * 3600 + 600,
            "gpus": laptop,
            "leases": [],
            "jobs": [],
        },
    ]


OTHER_COMPUTERS: list[tuple[str, str, list[tuple[int, str, str, str, int]]]] = [
    # (name, scenario, leases: (mib, project, session, purpose, MiB used))
    (
        "render-02",
        '[[gpu]]\nname = "Simulated RTX A6000"\ntotal_mib = 49140\nused_mib = 2500\n',
        [(44000, "genai", "sdxl-lora", "SDXL LoRA fine-tune", 41000)],
    ),
    (
        "gpu-box-03",
        "".join(
            f'[[gpu]]\nname = "Simulated A100 80GB"\ntotal_mib = 81920\nused_mib = {u}\n'
            for u in (400, 400, 30000, 400)
        ),
        [(32768, "speech", "whisper-eval", "evaluate Whisper large-v3", 30500)],
    ),
    (
        "laptop-anna",
        '[[gpu]]\nname = "Simulated RTX 3070 Laptop"\ntotal_mib = 8192\nused_mib = 900\n',
        [],
    ),
]


class DemoFleet:
    """A coordinator on 127.0.0.1 (SQLite, plain HTTP) and three more simulated computers
    reporting to it, next to a `DemoBroker` enrolled as `lab-ws-01`; two of the others stop
    so the fleet shows every freshness state. Needs the `server` extra (run as processes:
    the tray never imports the server)."""

    STALE_AFTER_S = 8.0
    OFFLINE_AFTER_S = 20.0

    def __init__(self, demo: DemoBroker) -> None:
        self.demo = demo
        self.root = demo.root / "fleet"
        self.url = ""
        self.procs: list[subprocess.Popen[bytes]] = []
        self.brokers: dict[str, subprocess.Popen[bytes]] = {}

    @staticmethod
    def available() -> bool:
        import importlib.util

        return all(importlib.util.find_spec(m) is not None for m in ("rbroker_server", "litestar"))

    def _server(self, *args: str) -> str:
        out = subprocess.run(
            [sys.executable, "-m", "rbroker_server", *args, "--data-dir", str(self.root / "c")],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if out.returncode != 0:
            raise RuntimeError(f"rbroker-server {args[0]} failed: {out.stderr[-500:]}")
        return out.stdout

    def _code(self) -> str:
        import re

        text = self._server("enroll-code", "create", "--group", "demo")
        match = re.search(r"\brbe_[A-Za-z0-9_-]+", text)
        if match is None:
            raise RuntimeError(f"no enrollment code in {text!r}")
        return match.group(0)

    def start(self, timeout_s: float = 60.0) -> None:
        import socket as socketlib

        import httpx

        from rbroker.uplink.enroll import enroll

        with socketlib.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.root.mkdir(parents=True, exist_ok=True)
        self._server(
            "setup",
            "--bind",
            "127.0.0.1",
            "--port",
            str(port),
            "--public-hostname",
            "127.0.0.1",
            "--group",
            "demo",
            "--non-interactive",
        )
        config = self.root / "c" / "config.toml"
        text = config.read_text()
        text = text.replace("stale_after_s = 15.0", f"stale_after_s = {self.STALE_AFTER_S}")
        text = text.replace("offline_after_s = 300.0", f"offline_after_s = {self.OFFLINE_AFTER_S}")
        config.write_text(text)
        log = open(self.root / "coordinator.log", "wb")  # noqa: SIM115 - the child keeps it
        self.procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "rbroker_server",
                    "serve",
                    "--data-dir",
                    str(self.root / "c"),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
        log.close()
        self.url = f"http://127.0.0.1:{port}"

        def healthy() -> bool:
            try:
                return httpx.get(self.url + "/healthz", timeout=1.0).status_code == 200
            except httpx.HTTPError:
                return False

        DemoBroker._wait(healthy, timeout_s)
        enroll(self.url, self._code(), "lab-ws-01", self.demo.root / "data", key_file=True)
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        for name, scenario, leases in OTHER_COMPUTERS:
            base = self.root / name
            base.mkdir()
            (base / "scenario.toml").write_text(scenario)
            enroll(self.url, self._code(), name, base / "data", key_file=True)
            sock = str(base / "b.sock")
            blog = open(base / "broker.log", "wb")  # noqa: SIM115 - the child keeps it
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "rbroker",
                    "broker",
                    "--simulate",
                    str(base / "scenario.toml"),
                    "--socket",
                    sock,
                    "--data-dir",
                    str(base / "data"),
                ],
                stdout=blog,
                stderr=subprocess.STDOUT,
            )
            blog.close()
            self.brokers[name] = proc
            self.procs.append(proc)
            DemoBroker._wait(lambda sock=sock: _answers(sock), timeout_s)
            for mib, project, session, purpose, use in leases:
                self.procs.append(
                    subprocess.Popen(
                        [
                            sys.executable,
                            "-c",
                            WORKER,
                            sock,
                            str(mib),
                            "",
                            project,
                            session,
                            purpose,
                            str(use),
                        ],
                        env=env,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                )

    def computers(self) -> list[dict[str, Any]]:
        """The fleet as this computer reads it (signed with its key)."""
        from rbroker.tray.fleet import UplinkFleet

        return UplinkFleet(self.demo.root / "data").computers()

    def settle(self, timeout_s: float = 90.0) -> None:
        """Wait until all four computers reported their leases, then stop `laptop-anna`
        (goes offline) and, later, `gpu-box-03` (goes stale)."""

        def all_reported() -> bool:
            try:
                cs = self.computers()
            except Exception:
                return False
            online = {c["name"] for c in cs if c["freshness"] == "online"}
            leased = sum(len(c["leases"]) for c in cs)
            return len(online) == 4 and leased >= 4 + 2

        DemoBroker._wait(all_reported, timeout_s)
        self._stop(self.brokers["laptop-anna"])
        time.sleep(self.OFFLINE_AFTER_S - self.STALE_AFTER_S)
        self._stop(self.brokers["gpu-box-03"])

        def states() -> bool:
            fresh = {c["name"]: c["freshness"] for c in self.computers()}
            return fresh.get("laptop-anna") == "offline" and fresh.get("gpu-box-03") == "stale"

        DemoBroker._wait(states, timeout_s)

    @staticmethod
    def _stop(proc: subprocess.Popen[bytes]) -> None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)


def _answers(sock: str) -> bool:
    try:
        with Client(sock, timeout_s=2):
            return True
    except RBrokerError:
        return False
