"""The demo fleet: a local coordinator with more simulated computers reporting to it, and
the same fleet as fixed data (`demo_fleet()`, for tests and `--static-fleet` screenshots).

No Qt here, and no server import: the coordinator runs as a process
(`rbroker.demo.coordinator`).
"""

from __future__ import annotations

import os
import subprocess
import time
from typing import Any

from rbroker.demo.coordinator import LocalCoordinator, server_available
from rbroker.demo.processes import ProcessGroup, broker_address, broker_command, stop_process
from rbroker.demo.world import DemoBroker, answers, holder_command, wait_for


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
        self.coordinator: LocalCoordinator | None = None
        self.children = ProcessGroup(grace_s=10.0)
        self.brokers: dict[str, subprocess.Popen[bytes]] = {}

    @staticmethod
    def available() -> bool:
        return server_available()

    @property
    def url(self) -> str:
        return self.coordinator.url if self.coordinator is not None else ""

    def start(self, timeout_s: float = 60.0) -> None:
        """Set up and serve the coordinator, enroll the demo broker and start the others.

        Raises:
            rbroker.demo.coordinator.CoordinatorError, RuntimeError: it did not come up.
        """
        self.root.mkdir(parents=True, exist_ok=True)
        self.coordinator = coordinator = LocalCoordinator.setup(
            self.root / "c",
            group="demo",
            settings={
                "stale_after_s": self.STALE_AFTER_S,
                "offline_after_s": self.OFFLINE_AFTER_S,
            },
        )
        coordinator.log_name = "../coordinator.log"
        coordinator.start(timeout_s=timeout_s, log_level="info")
        coordinator.enroll("lab-ws-01", self.demo.root / "data")
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        for name, scenario, leases in OTHER_COMPUTERS:
            base = self.root / name
            base.mkdir()
            (base / "scenario.toml").write_text(scenario)
            coordinator.enroll(name, base / "data")
            sock = broker_address(base, "b")
            with open(base / "broker.log", "wb") as blog:
                cmd = broker_command(sock, base / "data", base / "scenario.toml")
                self.brokers[name] = self.children.spawn(cmd, stdout=blog)
            wait_for(lambda sock=sock: answers(sock), timeout_s)  # type: ignore[misc]
            for mib, project, session, purpose, use in leases:
                cmd = holder_command(sock, mib, None, project, session, purpose, use)
                self.children.spawn(cmd, stdout=subprocess.DEVNULL, env=env)

    def computers(self) -> list[dict[str, Any]]:
        """The fleet as this computer reads it (signed with its key), as
        `computers_from_fleet_view` gives it.

        Raises:
            FleetError: the fleet cannot be read now.
            ValueError: this computer's enrollment file is broken.
        """
        from rbroker.uplink.fleet import computers_from_fleet_view, fetch_fleet

        return computers_from_fleet_view(fetch_fleet(self.demo.root / "data"))

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

        wait_for(all_reported, timeout_s)
        stop_process(self.brokers["laptop-anna"])
        time.sleep(self.OFFLINE_AFTER_S - self.STALE_AFTER_S)
        stop_process(self.brokers["gpu-box-03"])

        def states() -> bool:
            fresh = {c["name"]: c["freshness"] for c in self.computers()}
            return fresh.get("laptop-anna") == "offline" and fresh.get("gpu-box-03") == "stale"

        wait_for(states, timeout_s)

    def stop(self) -> None:
        """Stop the other computers' brokers and workers, then the coordinator."""
        self.children.stop()
        if self.coordinator is not None:
            self.coordinator.stop()
