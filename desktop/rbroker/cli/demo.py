"""`rbroker demo`: real worker processes lease GPU memory from a real local broker.

Starts a broker on a temporary socket (a named pipe on Windows) and data dir (simulated GPUs
unless a real NVIDIA driver answers), launches eight worker processes that use the SDK with
different sizes and purposes — some are admitted at once, some wait with a reason that shows
the arithmetic — kills one mid-run (SIGKILL; TerminateProcess on Windows) and measures how
fast its memory comes back, then prints a summary. Everything it started is stopped on exit,
also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.text import Text

import rbroker
from rbroker.base.children import HARD_KILL_NAME, STOP_SIGNALS, kill_tree
from rbroker.base.display import fmt_mib, short_uuid
from rbroker.cli.setup_ticker import SetupTicker
from rbroker.cli.views import broker_view
from rbroker.demo.coordinator import CoordinatorError, LocalCoordinator, server_available
from rbroker.demo.job import expected_counts
from rbroker.demo.processes import ProcessGroup, broker_address, broker_command, worker_command
from rbroker.demo.world import (
    DEMO_SCENARIO,
    JOB_START_S,
    KILL_AFTER_GRANT_S,
    WORKERS,
    job_command,
)
from rbroker.gpu.nvml import real_nvml_available
from rbroker_protocol.eta import eta_words
from rbroker_protocol.results import GpuView, ListedLease, QueuedRequest

WORKER_PART_S = 20.0
"""How long the worker timeline of `world.WORKERS` takes at its own pace (measured: the last
waiter is granted about 11 s in and releases about 8 s later); `--seconds` scales it."""
SECONDS_MIN, SECONDS_MAX = 10.0, 600.0
"""The bounds of `--seconds`: below 10 s the waits and the kill run into one another."""


@dataclass
class DemoState:
    """What the demo saw, for the live view and the summary."""

    t0: float = field(default_factory=time.time)
    events: list[str] = field(default_factory=list)
    kill_wall: float | None = None
    victim_lease: ListedLease | None = None
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
    keep: bool = False  # --keep: broker and coordinator stay up after the summary
    printed: int = 0  # events printed so far (without the live view)
    # per waiting session: (seconds into its wait, eta_s, reason) of its first estimate
    etas: dict[str, tuple[float, float | None, str]] = field(default_factory=dict)

    def saw_estimate(self, entry: QueuedRequest) -> None:
        """Keep a waiting request's first estimate (its first with a figure, when the first
        had none), and log it."""
        session, eta_s = entry["session"], entry.get("eta_s")
        known = self.etas.get(session)
        if "eta_s" not in entry or (known is not None and (known[1] is not None or eta_s is None)):
            return
        self.etas[session] = (entry["waiting_s"], eta_s, str(entry.get("eta_reason") or ""))
        if eta_s is not None:
            self.log(f"{session} {eta_words(entry)}")

    def log(self, text: str) -> None:
        self.events.append(f"+{time.time() - self.t0:5.1f} s  {text}")


def ms_text(seconds: float) -> str:
    """A duration in seconds as whole milliseconds, `"12 ms"`; never negative (a wall clock
    stepped back between two readings shows `"0 ms"`)."""
    return f"{max(0, round(seconds * 1000))} ms"


def _check_snapshot(state: DemoState, gpus: Sequence[GpuView]) -> None:
    """granted + others' use + headroom must never exceed total on any GPU.

    Others' use is the memory of processes without a lease there: `other_in_use_mib` less
    `held_outside_mib`. The demo's workers allocate only inside their leases, so what the
    broker books as a holder's memory outside its lease is that lease's use: a sample that
    began before a grant and read the holder's first allocation after it counts that
    allocation as held before the grant (docs/architecture.md §2), on purpose twice, once
    held and once granted. Counting it a second time here made a loaded machine's demo
    report an over-admission the GPU never had (`committed > total` by one first step)."""
    state.snapshots += 1
    for g in gpus:
        if not g.get("total_mib"):
            continue
        others = g["other_in_use_mib"] - g.get("held_outside_mib", 0)
        committed = g["granted_mib"] + others + g["headroom_mib"]
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
    for sig in STOP_SIGNALS:
        signal.signal(sig, _interrupt)
    root = Path(tempfile.mkdtemp(prefix="rbroker-demo-"))
    sock = broker_address(root)
    scenario = root / "scenario.toml"
    scenario.write_text(DEMO_SCENARIO)
    state = DemoState()
    state.keep = args.keep
    pace = float(args.seconds) / WORKER_PART_S
    # a stuck worker cannot hold the demo: past this it ends, unless the parallel job still
    # reports chunks (a slow machine's job finishes, `_over_time`)
    budget_s = float(args.seconds) * 1.5 + 15.0
    console.print(
        f"rbroker demo: a local broker, {len(WORKERS)} worker processes and a parallel job "
        f"for about {args.seconds:g} s, after a few seconds of setup (Ctrl-C stops it all)",
        soft_wrap=not console.is_terminal,
        highlight=False,
    )
    ticker = SetupTicker(console)
    interrupted = kept = False
    try:
        with ProcessGroup() as procs:
            broker_log = open(root / "broker.log", "wb")  # noqa: SIM115 - closed below
            try:
                ticker.step("Looking for an NVIDIA driver…")
                state.simulated = args.simulate or not real_nvml_available()
                coordinator = _start_coordinator(ticker, root, procs, state)
                ticker.step("Starting the broker…")
                cmd = broker_command(sock, root / "data", scenario if state.simulated else None)
                broker = procs.spawn(cmd, stdout=broker_log)
                client = _connect(sock, broker, root)
                ticker.done()
                with client:
                    status = client.status()
                    src = (
                        "SIMULATED GPUs (no NVIDIA driver is used)"
                        if status["simulated"]
                        else f"real GPUs (NVML, driver {status['driver_version']})"
                    )
                    console.print(
                        f"[bold]rbroker demo[/] — broker on {escape(str(sock))} — {escape(src)}",
                        soft_wrap=not console.is_terminal,
                    )
                    gpus = client.gpus()
                    state.log(f"broker up: {len(gpus)} GPUs, {src}")
                    state.log(
                        "each worker declares how long it will hold its lease (its plan): the "
                        "queue's estimates come from the holders' declared durations"
                    )
                    if not state.simulated:
                        usable = min(g.get("total_mib", 0) - g.get("headroom_mib", 0) for g in gpus)
                        state.scale = max(0.01, usable / 22323)
                    if coordinator is not None:
                        console.print(
                            f"coordinator: {coordinator.url}  fleet: {coordinator.url}"
                            f"/api/v1/fleet  viewer token: {coordinator.token}",
                            soft_wrap=not console.is_terminal,
                        )
                    _run_workers(
                        console, client, sock, procs, state, live_ok, budget_s, coordinator, pace
                    )
                    summary = _summary(client, state, coordinator)
                    if args.keep:
                        console.print(summary, soft_wrap=not console.is_terminal)
                        kept = True
                        _keep_running(console, sock, coordinator)
            finally:
                broker_log.close()
    except KeyboardInterrupt:
        ticker.done()
        if not kept:
            interrupted = True
            console.print("\n[yellow]demo interrupted: broker and workers stopped[/]")
        else:
            console.print("\nbroker and coordinator stopped")
    finally:
        ticker.done()
        shutil.rmtree(root, ignore_errors=True)
    if interrupted:
        return 130
    if not kept:
        console.print(
            summary, soft_wrap=not console.is_terminal
        )  # commands and tokens stay copyable
    ok = (
        not state.violations
        and state.freed_after_s is not None
        and state.freed_after_s < 1.0
        and state.job_exact
        and state.coordinator_ok
    )
    return 0 if ok else 1


def _keep_running(console: Console, sock: str, coordinator: LocalCoordinator | None) -> None:
    """`--keep`: the broker (and the coordinator) stay up after the summary until Ctrl-C,
    `kill` or a closed terminal (a `KeyboardInterrupt`, which ends the demo as usual)."""
    where = f"broker on {sock}" + (f", coordinator at {coordinator.url}" if coordinator else "")
    console.print(f"kept running: {where} — Ctrl-C stops them", soft_wrap=not console.is_terminal)
    if coordinator is not None:
        console.print(
            f"web view: open {coordinator.url}/ in a browser and sign in with the viewer token "
            f"{coordinator.token}",
            soft_wrap=not console.is_terminal,
            highlight=False,
        )
    console.print(
        f"this computer's broker: RBROKER_SOCKET={sock} rbroker status",
        soft_wrap=not console.is_terminal,
    )
    while True:
        time.sleep(3600)


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
    procs: ProcessGroup,
    state: DemoState,
    live_ok: bool,
    budget_s: float,
    coordinator: LocalCoordinator | None,
    pace: float = 1.0,
) -> None:
    """Play `WORKERS` with every start, hold and the kill's delay multiplied by `pace`
    (`--seconds` / `WORKER_PART_S`)."""
    workers: dict[str, subprocess.Popen[bytes]] = {}
    next_fleet_poll = 0.0
    seen_granted: set[str] = set()
    seen_queued: set[str] = set()
    granted_at: dict[str, float] = {}
    pending = sorted(WORKERS, key=lambda w: w.start_s)
    job_proc: subprocess.Popen[bytes] | None = None
    victim = next(w for w in WORKERS if w.victim)
    job_chunks, job_moved, job_said_done = 0, 0.0, False
    start = time.monotonic()
    live = Live(console=console, refresh_per_second=8, transient=False) if live_ok else None
    with live if live is not None else contextlib.nullcontext():
        while True:
            now = time.monotonic() - start
            while pending and pending[0].start_s * pace <= now:
                w = pending.pop(0)
                mib = max(1, int(w.mib * state.scale))
                cmd = worker_command(
                    sock, mib, w.project, w.session, w.purpose, hold_s=w.hold_s * pace
                )
                workers[w.session] = procs.spawn(cmd)
                state.log(f"worker {w.session} asks for {fmt_mib(w.mib)} MiB: {w.purpose}")
            if job_proc is None and now >= JOB_START_S * pace:
                job_proc = procs.spawn(job_command(sock))
                state.log("parallel job starts: 3 pool workers, 24 chunks of 50 items")
            gpus = client.gpus()
            view = client.leases(include_ended=True)
            jobs = client.jobs()
            chunks = sum(j["chunks_reported"] for j in jobs)
            if chunks != job_chunks:
                if not job_chunks:
                    state.log(f"parallel job reported its first chunk ({chunks} so far)")
                job_chunks, job_moved = chunks, now
            if job_proc is not None and not job_said_done and job_proc.poll() is not None:
                job_said_done = True
                state.log(
                    f"parallel job process exited ({job_proc.returncode}): {chunks} chunks "
                    f"reported, {now - JOB_START_S * pace:.1f} s after it started"
                )
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
                state.saw_estimate(q)
            vw = workers.get(victim.session)
            if (
                state.kill_wall is None
                and vw is not None
                and victim.session in granted_at
                and time.time() - granted_at[victim.session] >= KILL_AFTER_GRANT_S * pace
            ):
                state.kill_wall = time.time()  # before the signal: the lease may end at once
                kill_tree(vw)
                state.victim_lease = next(
                    (x.copy() for x in view["leases"] if x["session"] == victim.session),
                    None,
                )
                state.log(f"killed worker {victim.session} with {HARD_KILL_NAME} mid-run")
            if state.kill_wall is not None and state.freed_after_s is None:
                for ended in view.get("ended", []):
                    if ended["session"] == victim.session:
                        state.freed_after_s = max(0.0, ended["ended_at"] - state.kill_wall)
                        state.log(
                            f"lease of {victim.session} freed {ms_text(state.freed_after_s)}"
                            f" after the kill ({ended['ended_reason']})"
                        )
            if live is not None:
                recent = Text("\n".join(state.events[-9:]), style="dim")
                live.update(Group(broker_view(gpus, view, "rbroker demo — live", jobs), recent))
            else:
                _print_events(console, state)
            done = (
                not pending
                and all(p.poll() is not None for p in workers.values())
                and job_proc is not None
                and job_proc.poll() is not None
            )
            if done:
                break
            if _over_time(now, budget_s, job_moved):
                running = [s for s, p in workers.items() if p.poll() is None]
                if job_proc is not None and job_proc.poll() is None:
                    running.append(f"the parallel job ({job_chunks} chunks reported)")
                state.log(
                    f"demo time is up after {now:.0f} s; stopping what still runs: "
                    + (", ".join(running) or "nothing")
                )
                if live is None:
                    _print_events(console, state)
                break
            time.sleep(0.1)


JOB_STALL_S = 15.0
"""Past the demo's budget, how long the parallel job may go without a new chunk before the
demo stops it (`_over_time`)."""


def _over_time(now: float, budget_s: float, job_moved: float) -> bool:
    """Whether the demo stops at `now` (seconds into its timeline): past `budget_s` once the
    parallel job's last new chunk (`job_moved`) is `JOB_STALL_S` old, and past three times
    `budget_s` in any case. A loaded machine (a Windows one under test, several suites at
    once) starts the job's pool workers slowly: a job still reporting is let finish, a stuck
    one is not waited for."""
    if now > 3 * budget_s:
        return True
    return now > budget_s and now - job_moved > JOB_STALL_S


def _print_events(console: Console, state: DemoState) -> None:
    """Print the events logged since the last call (without the live view), once the first
    snapshot was taken."""
    while state.snapshots and len(state.events) > state.printed:
        console.print(
            state.events[state.printed],
            soft_wrap=not console.is_terminal,
            markup=False,
            highlight=False,
        )
        state.printed += 1


def _start_coordinator(
    ticker: SetupTicker, root: Path, procs: ProcessGroup, state: DemoState
) -> LocalCoordinator | None:
    """Set up and serve a coordinator on SQLite in the demo's temp dir (127.0.0.1), and
    enroll the demo's broker data dir with a 0600 key file, each step said by `ticker`. None
    (with a message) when the server extra is not installed or it does not start."""
    if not server_available():
        ticker.step("coordinator: skipped (install rbroker[server] to see the fleet part)")
        return None
    ticker.step("Setting up a coordinator on SQLite (its database and a viewer token)…")
    try:
        coordinator = LocalCoordinator.setup(root / "coordinator", group="demo")
    except CoordinatorError as exc:
        ticker.step(f"coordinator: setup failed, skipped ({str(exc)[-300:]})")
        return None
    ticker.step("Starting the coordinator…")
    try:
        coordinator.start(wait=False, bind=True)
    finally:
        if coordinator.proc is not None:
            procs.adopt(coordinator.proc)
    try:
        coordinator.wait_healthy(30)
    except CoordinatorError:
        ticker.step("coordinator: did not start, skipped")
        return None
    from rbroker.uplink.enroll import EnrollError

    ticker.step("Enrolling this computer in the coordinator…")
    try:
        coordinator.enroll("demo-computer", root / "data", code=coordinator.first_code)
    except EnrollError as exc:
        ticker.step(f"coordinator: enrollment failed, skipped ({exc})")
        return None
    state.log("coordinator up on SQLite; this computer enrolled as demo-computer")
    return coordinator


def _poll_fleet(coordinator: LocalCoordinator, state: DemoState) -> None:
    try:
        fleet = coordinator.fleet()
    except httpx.HTTPError as exc:
        state.fleet_error = str(exc)
        return
    state.fleet_polls += 1
    for computer in fleet.get("computers", []):
        state.fleet_max_leases = max(state.fleet_max_leases, len(computer.get("leases", [])))
        state.fleet_max_queue = max(state.fleet_max_queue, len(computer.get("queue", [])))


def _eta_line(first: tuple[float, float | None, str] | None, waited_s: float) -> str:
    """How close a waiter's first estimate came: `first` is (seconds into its wait, eta_s,
    reason) from `DemoState.etas`, `waited_s` its whole wait."""
    if first is None:
        return "when: no estimate was shown (the broker gave none)"
    at_s, eta_s, reason = first
    if eta_s is None:
        return f"when: no estimate ({reason})"
    actual_s = max(0.0, waited_s - at_s)
    off = actual_s - eta_s
    return (
        f"when: {at_s:.1f} s into its wait the broker said likely in ~{eta_s:.0f} s; granted "
        f"after {actual_s:.1f} s: {abs(off):.1f} s {'later' if off > 0 else 'sooner'} than told"
    )


def _summary(
    client: rbroker.Client, state: DemoState, coordinator: LocalCoordinator | None
) -> Text:
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
        lines.append(f"    {_eta_line(state.etas.get(lease['session']), lease['waited_s'])}")
    victim = next(w for w in WORKERS if w.victim)
    if state.freed_after_s is not None:
        v: Mapping[str, Any] = ended.get(victim.session, {})
        lines.append(
            f"crash: worker {victim.session} killed with {HARD_KILL_NAME} while holding "
            f"{fmt_mib(v.get('granted_mib', victim.mib))} MiB; its lease was freed "
            f"{ms_text(state.freed_after_s)} later ({v.get('ended_reason', '?')})"
        )
        after = [
            lease["granted_at"] - state.kill_wall
            for lease in leases
            if state.kill_wall is not None and lease["granted_at"] > state.kill_wall
        ]
        if after:
            lines.append(
                f"       the next waiter was admitted {ms_text(min(after))} after the kill"
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


def _coordinator_summary(coordinator: LocalCoordinator, state: DemoState) -> list[str]:
    time.sleep(1.5)  # one debounced report after the last change
    try:
        fleet = coordinator.fleet()
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
        + ("" if state.keep else "  (the coordinator stops with the demo; --keep keeps it up)")
    )
    return lines
