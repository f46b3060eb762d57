"""`rbroker demo`: real worker processes lease GPU memory from a real local broker.

Starts a broker on a temporary socket and data dir (simulated GPUs unless a real NVIDIA
driver answers), launches eight worker processes that use the SDK with different sizes
and purposes — some are admitted at once, some wait with a reason that shows the
arithmetic — kills one with SIGKILL mid-run and measures how fast its memory comes back,
then prints a summary. Everything it started is stopped on exit, also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

import rbroker
from rbroker.broker.capacity import fmt_mib, short_uuid
from rbroker.cli.demo_job import expected_counts
from rbroker.cli.views import broker_view
from rbroker.gpu.select import real_nvml_available

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
    """One demo worker: when it starts (s after the demo), what it asks for and holds."""

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


@dataclass
class DemoState:
    """What the demo saw, for the live view and the summary."""

    t0: float = field(default_factory=time.time)
    events: list[str] = field(default_factory=list)
    kill_wall: float | None = None
    victim_lease: dict[str, Any] | None = None
    freed_after_s: float | None = None
    snapshots: int = 0
    min_margin_mib: int | None = None
    violations: list[str] = field(default_factory=list)
    job_exact: bool = True
    simulated: bool = True
    scale: float = 1.0
    fleet_max_leases: int = 0
    fleet_max_queue: int = 0
    fleet_polls: int = 0
    fleet_error: str = ""
    coordinator_ok: bool = True

    def log(self, text: str) -> None:
        self.events.append(f"+{time.time() - self.t0:5.1f} s  {text}")


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    """Linux: the child gets SIGTERM if the demo dies without cleaning up."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _child_setup() -> None:  # pragma: no cover - runs in the child
    os.setpgid(0, 0)
    _die_with_parent()


@contextlib.contextmanager
def _processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    try:
        yield procs
    finally:
        # every child leads its own process group: signal the group, so that the pool
        # workers of the parallel job go too
        for p in procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        for p in procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)


def _check_snapshot(state: DemoState, gpus: list[dict[str, Any]]) -> None:
    """granted + others' use + headroom must never exceed total on any GPU."""
    state.snapshots += 1
    for g in gpus:
        if not g.get("total_mib"):
            continue
        committed = g["granted_mib"] + g["other_in_use_mib"] + g["headroom_mib"]
        margin = g["total_mib"] - committed
        if state.min_margin_mib is None or margin < state.min_margin_mib:
            state.min_margin_mib = margin
        if margin < 0:
            state.violations.append(
                f"{short_uuid(g['uuid'])}: {fmt_mib(committed)} MiB committed > "
                f"{fmt_mib(g['total_mib'])} total"
            )


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def run_demo(args: argparse.Namespace) -> int:
    """Run the demo; exit 0 when every check passed, 1 otherwise, 130 on Ctrl-C."""
    console = Console()
    live_ok = console.is_terminal and not args.no_live
    # Ctrl-C, `kill` and a closed terminal all end the demo through the same cleanup path,
    # also where the shell started it with SIGINT ignored (a background job).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)
    root = Path(tempfile.mkdtemp(prefix="rbroker-demo-"))
    sock = str(root / "broker.sock")
    scenario = root / "scenario.toml"
    scenario.write_text(DEMO_SCENARIO)
    state = DemoState()
    state.simulated = args.simulate or not real_nvml_available()
    budget_s = max(30.0, float(args.seconds) + 15.0)
    interrupted = False
    try:
        with _processes() as procs:
            broker_log = open(root / "broker.log", "wb")  # noqa: SIM115 - closed below
            try:
                coordinator = _start_coordinator(console, root, procs, state)
                simulate = ["--simulate", str(scenario)] if state.simulated else []
                procs.append(
                    subprocess.Popen(
                        [
                            sys.executable,
                            "-m",
                            "rbroker",
                            "broker",
                            *simulate,
                            "--socket",
                            sock,
                            "--data-dir",
                            str(root / "data"),
                        ],
                        stdout=broker_log,
                        stderr=subprocess.STDOUT,
                        preexec_fn=_child_setup,
                    )
                )
                client = _connect(sock, procs[-1], root)
                with client:
                    status = client.status()
                    src = (
                        "SIMULATED GPUs (no NVIDIA driver is used)"
                        if status["simulated"]
                        else f"real GPUs (NVML, driver {status['driver_version']})"
                    )
                    console.print(f"[bold]rbroker demo[/] — broker on {sock} — {src}")
                    gpus = client.gpus()
                    state.log(f"broker up: {len(gpus)} GPUs, {src}")
                    if not state.simulated:
                        usable = min(g.get("total_mib", 0) - g.get("headroom_mib", 0) for g in gpus)
                        state.scale = max(0.01, usable / 22323)
                    if coordinator is not None:
                        console.print(
                            f"coordinator: {coordinator.url}  fleet: {coordinator.url}"
                            f"/api/v1/fleet  viewer token: {coordinator.token}",
                            soft_wrap=True,
                        )
                    _run_workers(
                        console, client, sock, procs, state, live_ok, budget_s, coordinator
                    )
                    summary = _summary(client, state, coordinator)
            finally:
                broker_log.close()
    except KeyboardInterrupt:
        interrupted = True
        console.print("\n[yellow]demo interrupted: broker and workers stopped[/]")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if interrupted:
        return 130
    console.print(summary, soft_wrap=True)  # commands and tokens stay copyable
    ok = (
        not state.violations
        and state.freed_after_s is not None
        and state.freed_after_s < 1.0
        and state.job_exact
        and state.coordinator_ok
    )
    return 0 if ok else 1


def _connect(sock: str, broker: subprocess.Popen[bytes], root: Path) -> rbroker.Client:
    deadline = time.monotonic() + 20
    while True:
        if broker.poll() is not None:
            log = (root / "broker.log").read_text(errors="replace")
            raise SystemExit(f"rbroker demo: the broker exited:\n{log}")
        try:
            return rbroker.Client(sock, timeout_s=10)
        except rbroker.BrokerUnavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _run_workers(
    console: Console,
    client: rbroker.Client,
    sock: str,
    procs: list[subprocess.Popen[bytes]],
    state: DemoState,
    live_ok: bool,
    budget_s: float,
    coordinator: Coordinator | None,
) -> None:
    workers: dict[str, subprocess.Popen[bytes]] = {}
    next_fleet_poll = 0.0
    seen_granted: set[str] = set()
    seen_queued: set[str] = set()
    granted_at: dict[str, float] = {}
    pending = sorted(WORKERS, key=lambda w: w.start_s)
    job_proc: subprocess.Popen[bytes] | None = None
    victim = next(w for w in WORKERS if w.victim)
    start = time.monotonic()
    live = Live(console=console, refresh_per_second=8, transient=False) if live_ok else None
    with live if live is not None else contextlib.nullcontext():
        while True:
            now = time.monotonic() - start
            while pending and pending[0].start_s <= now:
                w = pending.pop(0)
                workers[w.session] = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "rbroker.cli.demo_worker",
                        "--socket",
                        sock,
                        "--mib",
                        str(max(1, int(w.mib * state.scale))),
                        "--hold-s",
                        str(w.hold_s),
                        "--project",
                        w.project,
                        "--session",
                        w.session,
                        "--purpose",
                        w.purpose,
                    ],
                    preexec_fn=_child_setup,
                )
                procs.append(workers[w.session])
                state.log(f"worker {w.session} asks for {fmt_mib(w.mib)} MiB: {w.purpose}")
            if job_proc is None and now >= JOB_START_S:
                job_proc = subprocess.Popen(
                    [sys.executable, "-m", "rbroker.cli.demo_job", "--socket", sock],
                    preexec_fn=_child_setup,
                )
                procs.append(job_proc)
                state.log("parallel job starts: 3 pool workers, 24 chunks of 50 items")
            gpus = client.gpus()
            view = client.leases(include_ended=True)
            jobs = client.jobs()
            if coordinator is not None and now >= next_fleet_poll:
                next_fleet_poll = now + 2.0
                _poll_fleet(coordinator, state)
            _check_snapshot(state, gpus)
            for lease in view["leases"]:
                if lease["session"] not in seen_granted:
                    seen_granted.add(lease["session"])
                    granted_at[lease["session"]] = time.time()
                    waited = lease["waited_s"]
                    state.log(
                        f"granted {lease['session']}: {fmt_mib(lease['granted_mib'])} MiB on "
                        f"{short_uuid(lease['gpu_uuid'])}"
                        + (f" after waiting {waited:.1f} s" if waited > 0.05 else " at once")
                    )
            for q in view["queue"]:
                if q["session"] not in seen_queued:
                    seen_queued.add(q["session"])
                    state.log(f"{q['session']} {q['reason']}")
            vw = workers.get(victim.session)
            if (
                state.kill_wall is None
                and vw is not None
                and victim.session in granted_at
                and time.time() - granted_at[victim.session] >= KILL_AFTER_GRANT_S
            ):
                vw.send_signal(signal.SIGKILL)
                state.kill_wall = time.time()
                state.victim_lease = next(
                    (lease for lease in view["leases"] if lease["session"] == victim.session),
                    None,
                )
                state.log(f"killed worker {victim.session} with SIGKILL mid-run")
            if state.kill_wall is not None and state.freed_after_s is None:
                for ended in view.get("ended", []):
                    if ended["session"] == victim.session:
                        state.freed_after_s = ended["ended_at"] - state.kill_wall
                        state.log(
                            f"lease of {victim.session} freed {state.freed_after_s * 1000:.0f} ms"
                            f" after the kill ({ended['ended_reason']})"
                        )
            if live is not None:
                recent = Text("\n".join(state.events[-9:]), style="dim")
                live.update(Group(broker_view(gpus, view, "rbroker demo — live", jobs), recent))
            else:
                while state.snapshots and len(state.events) > getattr(state, "_printed", 0):
                    console.print(state.events[getattr(state, "_printed", 0)])
                    state._printed = getattr(state, "_printed", 0) + 1  # type: ignore[attr-defined]
            done = (
                not pending
                and all(p.poll() is not None for p in workers.values())
                and job_proc is not None
                and job_proc.poll() is not None
            )
            if done or now > budget_s:
                if not done:
                    state.log("demo time is up; stopping the remaining workers")
                break
            time.sleep(0.1)


@dataclass
class Coordinator:
    """The demo's embedded coordinator process."""

    url: str
    token: str


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_coordinator(
    console: Console, root: Path, procs: list[subprocess.Popen[bytes]], state: DemoState
) -> Coordinator | None:
    """Set up and serve a coordinator on SQLite in the demo's temp dir (127.0.0.1), and
    enroll the demo's broker data dir with a 0600 key file. None (with a message) when the
    server extra is not installed or it does not start."""
    if importlib.util.find_spec("rbroker_server") is None or (
        importlib.util.find_spec("litestar") is None
    ):
        console.print("coordinator: skipped (install rbroker[server] to see the fleet part)")
        return None
    port = _free_port()
    coord_dir = root / "coordinator"
    setup = subprocess.run(
        [
            sys.executable,
            "-m",
            "rbroker_server",
            "setup",
            "--data-dir",
            str(coord_dir),
            "--bind",
            "127.0.0.1",
            "--port",
            str(port),
            "--public-hostname",
            "127.0.0.1",
            "--group",
            "demo",
            "--non-interactive",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    token = re.search(r"\b(rbv_[A-Za-z0-9_-]+)", setup.stdout)
    code = re.search(r"\b(rbe_[A-Za-z0-9_-]+)", setup.stdout)
    if setup.returncode != 0 or token is None or code is None:
        console.print(f"coordinator: setup failed, skipped ({setup.stderr.strip()[-300:]})")
        return None
    log = open(root / "coordinator.log", "wb")  # noqa: SIM115 - the child keeps it
    procs.append(
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "rbroker_server",
                "serve",
                "--data-dir",
                str(coord_dir),
                "--log-level",
                "warning",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=_child_setup,
        )
    )
    log.close()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(url + "/healthz", timeout=1.0).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if procs[-1].poll() is not None or time.monotonic() > deadline:
            console.print("coordinator: did not start, skipped")
            return None
        time.sleep(0.2)
    from rbroker.uplink.enroll import EnrollError, enroll

    try:
        enroll(url, code.group(1), "demo-computer", root / "data", key_file=True)
    except EnrollError as exc:
        console.print(f"coordinator: enrollment failed, skipped ({exc})")
        return None
    state.log("coordinator up on SQLite; this computer enrolled as demo-computer")
    return Coordinator(url, token.group(1))


def _fetch_fleet(coordinator: Coordinator) -> dict[str, Any]:
    response = httpx.get(
        coordinator.url + "/api/v1/fleet",
        headers={"Authorization": f"Bearer {coordinator.token}"},
        timeout=5.0,
    )
    response.raise_for_status()
    return dict(response.json())


def _poll_fleet(coordinator: Coordinator, state: DemoState) -> None:
    try:
        fleet = _fetch_fleet(coordinator)
    except httpx.HTTPError as exc:
        state.fleet_error = str(exc)
        return
    state.fleet_polls += 1
    for computer in fleet.get("computers", []):
        state.fleet_max_leases = max(state.fleet_max_leases, len(computer.get("leases", [])))
        state.fleet_max_queue = max(state.fleet_max_queue, len(computer.get("queue", [])))


def _summary(client: rbroker.Client, state: DemoState, coordinator: Coordinator | None) -> Text:
    view = client.leases(include_ended=True)
    ended = {lease["session"]: lease for lease in view["ended"]}
    ended.update({lease["session"]: lease for lease in view["leases"]})
    demo_sessions = {w.session for w in WORKERS}
    leases = [ended[s] for s in (w.session for w in WORKERS) if s in ended]
    waited = [lease for lease in leases if lease["waited_s"] > 0.05]
    at_once = [lease for lease in leases if lease["waited_s"] <= 0.05]
    fits = [
        all(a["extra_mib"] <= a["available_mib"] for a in lease["admission"].values())
        for lease in leases
    ]
    lines = ["", "rbroker demo summary", "===================="]
    lines.append(
        f"leases granted: {len(leases)} of {len(demo_sessions)} requests "
        f"({len(at_once)} at once, {len(waited)} after waiting)"
    )
    for lease in sorted(waited, key=lambda item: -item["waited_s"]):
        lines.append(
            f"  waited {lease['waited_s']:5.1f} s  {fmt_mib(lease['granted_mib']):>6} MiB  "
            f"{lease['session']}: {lease['purpose']}"
        )
    victim = next(w for w in WORKERS if w.victim)
    if state.freed_after_s is not None:
        v = ended.get(victim.session, {})
        lines.append(
            f"crash: worker {victim.session} killed with SIGKILL while holding "
            f"{fmt_mib(v.get('granted_mib', victim.mib))} MiB; its lease was freed "
            f"{state.freed_after_s * 1000:.0f} ms later ({v.get('ended_reason', '?')})"
        )
        after = [
            lease["granted_at"] - state.kill_wall
            for lease in leases
            if state.kill_wall is not None and lease["granted_at"] > state.kill_wall
        ]
        if after:
            lines.append(
                f"       the next waiter was admitted {min(after) * 1000:.0f} ms after the kill"
            )
    else:
        lines.append(f"crash: worker {victim.session} was not killed or its lease not freed")
    lines.append(
        f"capacity check: {sum(fits)} of {len(fits)} grants fitted the memory available "
        "when they were decided"
    )
    margin = state.min_margin_mib
    verdict = "never exceeded" if not state.violations and all(fits) else "EXCEEDED"
    lines.append(
        f"granted memory {verdict} available: over {state.snapshots} snapshots, granted + "
        f"others' use + headroom ≤ total on every GPU (smallest margin "
        f"{fmt_mib(margin or 0)} MiB)"
    )
    for violation in state.violations[:5]:
        lines.append(f"  violation: {violation}")
    want_ok, want_failed = expected_counts()
    for job in client.jobs():
        exact = (job["completed_items"], job["failed_items"]) == (want_ok, want_failed)
        state.job_exact = state.job_exact and exact and job["state"] == "succeeded"
        lines.append(
            f"parallel job {job['handler']} ({job['purpose']}): {job['state']}, "
            f"{job['completed_items']} completed + {job['failed_items']} failed of "
            f"{job['total_items']} items in {job['chunks_reported']} chunks — "
            + (
                "exactly the counts the chunks reported"
                if exact
                else f"EXPECTED {want_ok} + {want_failed}"
            )
        )
    if coordinator is not None:
        lines += _coordinator_summary(coordinator, state)
    return Text("\n".join(lines))


def _coordinator_summary(coordinator: Coordinator, state: DemoState) -> list[str]:
    time.sleep(1.5)  # one debounced report after the last change
    try:
        fleet = _fetch_fleet(coordinator)
    except httpx.HTTPError as exc:
        state.coordinator_ok = False
        return [f"coordinator: could not read the fleet: {exc}"]
    lines = [f"coordinator ({coordinator.url}, group {fleet.get('group')}) saw:"]
    for c in fleet.get("computers", []):
        fresh = c.get("freshness", {})
        lines.append(
            f"  {c['name']}: {fresh.get('state')}, {len(c.get('gpus', []))} GPUs "
            f"({', '.join(str(g.get('state')) for g in c.get('gpus', []))}), "
            f"{c.get('reports_applied', 0)} signed reports applied; at most "
            f"{state.fleet_max_leases} leases and {state.fleet_max_queue} waiting requests "
            f"seen over {state.fleet_polls} fleet reads"
        )
        for job in c.get("jobs", []):
            lines.append(
                f"  job {job['handler']}: {job['state']}, {job['completed_items']} completed + "
                f"{job['failed_items']} failed of {job['total_items']}"
            )
        state.coordinator_ok = state.coordinator_ok and c.get("reports_applied", 0) > 0
    if not fleet.get("computers"):
        state.coordinator_ok = False
        lines.append("  no computer (reports did not arrive)")
    lines.append(
        f"  fleet: curl -H 'Authorization: Bearer {coordinator.token}' "
        f"{coordinator.url}/api/v1/fleet"
    )
    return lines
