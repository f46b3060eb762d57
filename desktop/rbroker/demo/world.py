"""The demo world: simulated GPUs, lease-holding workers, waiting requests and jobs.

No Qt here. Two scripts play in it, with the same pieces (`rbroker.demo.worker` processes
that hold leases and "use" them through `sim.allocate`, `rbroker.demo.job` processes,
children that never outlive the demo, and a fleet in `rbroker.demo.fleet`):

- `rbroker demo` (`rbroker.cli.demo`) plays a timeline on `DEMO_SCENARIO`: the eight
  `WORKERS` arrive half a second apart, some wait with a reason, one is killed mid-run,
  and a parallel job runs beside them.
- The screenshot tool plays a still life with `DemoBroker` on `SCENARIO`: four holders,
  two waiting requests and two jobs reporting progress, so every part of the window has
  live data.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from rbroker.base.exceptions import RBrokerError
from rbroker.client.local import Client
from rbroker.demo.processes import ProcessGroup, broker_address, worker_command
from rbroker.hosting.embedded import EmbeddedBroker
from rbroker.hosting.machine_lock import PER_SOCKET

# -- `rbroker demo`: the timeline -------------------------------------------------------------

DEMO_SCENARIO = """\
# rbroker demo: two simulated 24 GiB GPUs that other people already use a little.
[[gpu]]
uuid = "GPU-de300000-0000-0000-0000-000000000001"
name = "Simulated RTX 4090"
total_mib = 24576
[[gpu.process]]          # a desktop session's graphics process
pid = 4000
used_mib = 1024
kind = "graphics"

[[gpu]]
uuid = "GPU-de300000-0000-0000-0000-000000000002"
name = "Simulated RTX 4090"
total_mib = 24576
used_mib = 6144          # another user's job, outside rbroker
"""


@dataclass
class WorkerSpec:
    """One demo worker: when it starts (s after the demo), what it asks for and holds
    (`hold_s`: its plan, which it declares as its lease's expected duration; the victim's
    plan too, though the demo kills it `KILL_AFTER_GRANT_S` after its grant)."""

    start_s: float
    mib: int
    hold_s: float
    project: str
    session: str
    purpose: str
    victim: bool = False


WORKERS = [
    WorkerSpec(0.0, 12288, 10.0, "vision", "vit-ft-01", "fine-tune ViT-B/16 on food-101"),
    WorkerSpec(
        0.5, 10240, 30.0, "search", "embed-02", "embed product catalogue with e5-large", victim=True
    ),
    WorkerSpec(1.0, 8192, 9.0, "eval", "mmlu-03", "evaluate llama-3.1-8b on MMLU 5-shot"),
    WorkerSpec(1.5, 6144, 8.0, "render", "turntable-04", "render turntable frames 0-240"),
    WorkerSpec(2.0, 4096, 6.0, "media", "av1-05", "transcode lecture videos to AV1"),
    WorkerSpec(2.5, 16384, 7.0, "vision", "resnet-06", "train ResNet-50 baseline, seed 3"),
    WorkerSpec(3.0, 2048, 5.0, "eval", "reward-07", "score summaries with a reward model"),
    WorkerSpec(3.5, 9216, 6.0, "search", "rerank-08", "distil a cross-encoder reranker"),
]
KILL_AFTER_GRANT_S = 4.0
JOB_START_S = 1.0


def job_command(socket: str, *report: str) -> list[str]:
    """A `rbroker.demo.job` process: the pool job, or with `report` args a reporting one."""
    return [
        sys.executable, "-m", "rbroker.demo.job", "--socket", socket,
        *(["--report", *report] if report else []),
    ]  # fmt: skip


# -- the screenshots: a still life ------------------------------------------------------------

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
# (project, purpose, handler, total_items, workers, items per chunk, chunks at once)
JOBS: list[tuple[str, str, str, int, int, int, int]] = [
    ("nlp", "embed support tickets", "embed.encode_batch", 240_000, 4, 4_800, 27),
    ("vision", "caption product photos", "caption.run", 80_000, 2, 1_450, 10),
]
HOLD_S = 3600.0


def holder_command(
    socket: str, mib: int, gpu: str | None, project: str, session: str, purpose: str, use: int
) -> list[str]:
    """A still-life worker: waits for its lease as long as it takes, allocates `use` MiB at
    once, says `granted`, holds the lease for an hour (SDK default TTL)."""
    return worker_command(
        socket, mib, project, session, purpose, hold_s=HOLD_S, gpu_uuid=gpu, use_mib=use,
        steps=1, wait_s=HOLD_S, ttl_s=30.0, announce=True,
    )  # fmt: skip


def wait_for(pred: Callable[[], bool], timeout_s: float) -> None:
    """Poll `pred` every 50 ms until it holds.

    Raises:
        RuntimeError: not within `timeout_s`.
    """
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise RuntimeError("demo broker did not reach its state in time")
        time.sleep(0.05)


def answers(sock: str) -> bool:
    """True when a broker accepts a local API connection on `sock`."""
    try:
        with Client(sock, timeout_s=2):
            return True
    except RBrokerError:
        return False


class DemoBroker:
    """A simulated broker (in-process, as the tray runs it) on two GPUs with four lease
    holders, two waiting requests and two parallel jobs reporting progress."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root or Path(tempfile.mkdtemp(prefix="rbdemo-"))
        self.socket = broker_address(self.root)
        self.children = ProcessGroup()
        self.broker: EmbeddedBroker | None = None

    @property
    def procs(self) -> list[subprocess.Popen[bytes]]:
        return self.children.procs

    def start(self, timeout_s: float = 30.0) -> None:
        """Start the broker and its holders, waiters and jobs; return once the broker sees
        them all (and the holders' memory in a fresh sample).

        Raises:
            RuntimeError: the broker did not start or the world not settle in `timeout_s`.
        """
        from rbroker.hosting.host import make_config

        scenario = self.root / "scenario.toml"
        scenario.write_text(SCENARIO)
        config = make_config(self.socket, self.root / "data", True, scenario, None)
        # simulated: a machine lock of its own, so the demo runs beside any real broker
        config = dataclasses.replace(config, machine_lock=PER_SOCKET)
        self.broker = EmbeddedBroker(config)
        self.broker.start()
        if not self.broker.wait_ready(timeout_s):
            raise RuntimeError(f"demo broker did not start: {self.broker.error}")
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        quiet = subprocess.DEVNULL
        for mib, gpu, project, session, purpose, use in HOLDERS:
            cmd = holder_command(self.socket, mib, gpu, project, session, purpose, use)
            self.children.spawn(cmd, stdout=quiet, env=env)
            n = len(self.procs)
            wait_for(lambda n=n: self._count("leases") >= n, timeout_s)  # type: ignore[misc]
        for mib, gpu_or_none, project, session, purpose in WAITERS:
            cmd = holder_command(self.socket, mib, gpu_or_none, project, session, purpose, 0)
            self.children.spawn(cmd, stdout=quiet, env=env)
        wait_for(lambda: self._count("queue") >= len(WAITERS), timeout_s)
        for job in JOBS:
            self.children.spawn(job_command(self.socket, *map(str, job)), stdout=quiet, env=env)
        wait_for(self._jobs_running, timeout_s)
        # let the broker see the holders' allocations in a fresh sample
        wait_for(self._allocations_seen, timeout_s)

    def _count(self, what: Literal["leases", "queue"]) -> int:
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

    def stop(self) -> None:
        """Stop the workers and jobs, then the broker."""
        self.children.stop()
        if self.broker is not None:
            self.broker.stop()
