"""What the tray app costs while nothing happens: its CPU beside an idle broker (issue 44).

A real tray process (`python -m rbroker tray --attach-only`, Qt's offscreen platform) attached
to a real simulated broker process; the tray's CPU is read with psutil (user + system time of
its pid, all threads) over a window, as % of one core, with the broker's beside it. Kinds,
taking turns in each round (`--repeats`):

1. `0 leases, hidden`: the broker has no lease; the tray's window is closed, as a tray sits in
   the notification area all day;
2. `50 leases, 20 computers, hidden`: 50 leases held and heartbeating (5 holder processes,
   ttl 30 s, each renewed every 10 s), the broker enrolled at a coordinator whose group has 20
   computers (the broker reporting, 19 others copied from its row);
3. `50 leases, 20 computers, shown`: the same with the window open (offscreen counts as shown):
   the fleet tab reads the coordinator every 15 s and the ages are redrawn every 5 s.

Each kind starts its own tray (after its imports and first reads have settled) and the same
broker and coordinator serve all three. The targets are the issue's: ≤ 0.3 % of one core with
no lease, ≤ 1 % with 50 leases and 20 fleet computers.

    python bench/tray_idle.py [--quick] [--record] [--seconds 300] [--repeats 3]
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from _common import (
    SINGLE_24G,
    Broker,
    Report,
    median,
    parser,
    short_tmp,
    spread,
    verdict,
    wait_until_monotonic,
)
from heartbeats import Holders

from rbroker.demo.coordinator import LocalCoordinator

TARGET_IDLE_PCT = 0.3
TARGET_BUSY_PCT = 1.0
LEASES = 50
COMPUTERS = 20
KINDS = ("0 leases, hidden", "50 leases, 20 computers, hidden", "50 leases, 20 computers, shown")


@dataclass
class Samples:
    """CPU % of one core per round, of the tray and of the broker beside it."""

    tray: list[float] = field(default_factory=list)
    broker: list[float] = field(default_factory=list)
    rss_mib: list[float] = field(default_factory=list)


def start_tray(broker: Broker, config_home: Path, shown: bool) -> subprocess.Popen[bytes]:
    """`python -m rbroker tray --attach-only` on Qt's offscreen platform, its settings in
    `config_home` (saved once, so the window stays closed unless `shown`)."""
    env = {
        **os.environ,
        "QT_QPA_PLATFORM": "offscreen",
        "XDG_CONFIG_HOME": str(config_home),
        "XDG_RUNTIME_DIR": str(config_home),
    }
    cmd = [sys.executable, "-m", "rbroker", "tray", "--attach-only", "--socket", broker.socket]
    cmd += ["--data-dir", str(broker.data_dir), *(["--show"] if shown else [])]
    log = open(config_home / "tray.log", "ab")  # noqa: SIM115 - the child's output, closed below
    with log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def measure(
    broker: Broker, shown: bool, seconds: float, settle_s: float
) -> tuple[float, float, float]:
    """(tray CPU %, broker CPU %, tray RSS MiB) over `seconds`, from `settle_s` after a new
    tray's start.

    Raises:
        RuntimeError: the tray exited before the window (with its log's end).
    """
    home = short_tmp("rbt-")
    (home / "rbroker").mkdir()
    (home / "rbroker" / "tray.json").write_text(json.dumps({}))  # not a first run
    tray = start_tray(broker, home, shown)
    try:
        time.sleep(settle_s)
        if tray.poll() is not None:
            log = (home / "tray.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"the tray exited with {tray.returncode}: {log}")
        tproc, bproc = psutil.Process(tray.pid), psutil.Process(broker.pid)
        t0 = time.monotonic()
        tc0, bc0 = sum(tproc.cpu_times()[:2]), sum(bproc.cpu_times()[:2])
        wait_until_monotonic(t0 + seconds)
        wall = time.monotonic() - t0
        tray_pct = (sum(tproc.cpu_times()[:2]) - tc0) / wall * 100
        broker_pct = (sum(bproc.cpu_times()[:2]) - bc0) / wall * 100
        return tray_pct, broker_pct, tproc.memory_info().rss / 2**20
    finally:
        stop(tray)
        shutil.rmtree(home, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, help="window of each kind (300)")
    p.add_argument("--repeats", type=int, help="rounds, the kinds taking turns (3)")
    args = p.parse_args(argv)
    q = args.quick
    seconds = args.seconds or (3.0 if q else 300.0)
    repeats = args.repeats or (1 if q else 3)
    settle_s = 4.0 if q else 15.0
    leases = 5 if q else LEASES

    report = Report("The tray beside an idle broker (bench/tray_idle.py)", q)
    coordinator = LocalCoordinator.setup(short_tmp("rbts-") / "server")
    coordinator.start(timeout_s=60)
    root = short_tmp()
    (root / "data").mkdir()
    samples = {kind: Samples() for kind in KINDS}
    broker: Broker | None = None
    holders: Holders | None = None
    try:
        computer_id = coordinator.enroll("bench-tray", root / "data")
        broker = Broker.start(SINGLE_24G, root)
        assert broker is not None
        fleet_ready(coordinator, computer_id, broker.data_dir)
        for r in range(repeats):
            for i in range(len(KINDS)):
                kind = KINDS[(i + r) % len(KINDS)]
                busy = not kind.startswith("0 leases")
                if busy and holders is None:
                    holders = Holders("broker", broker.socket, 5, leases // 5, 30.0, beat=True)
                if not busy and holders is not None:
                    holders.stop()
                    holders = None
                    time.sleep(2.0)  # the releases told, before the window
                tray, bro, rss = measure(broker, kind.endswith("shown"), seconds, settle_s)
                samples[kind].tray.append(tray)
                samples[kind].broker.append(bro)
                samples[kind].rss_mib.append(rss)
    finally:
        if holders is not None:
            holders.stop()
        if broker is not None:
            note = broker.stop()
            if note:
                report.note(note)
        coordinator.stop()

    def pct(v: float) -> str:
        return f"{v:.2f} %"

    for kind in KINDS:
        s = samples[kind]
        target = TARGET_IDLE_PCT if kind.startswith("0 leases") else TARGET_BUSY_PCT
        report.add(
            f"tray CPU, {kind}",
            f"{spread(s.tray, pct)} of one core",
            f"broker beside it {pct(median(s.broker))}",
            "—",
            f"≤ {target:g} %",
            verdict(median(s.tray) <= target),
        )
    report.add(
        "tray RSS at the end of a window (largest of all)",
        f"{max(v for s in samples.values() for v in s.rss_mib):.0f} MiB",
    )
    report.note(
        f"{repeats} round(s) of {seconds:g} s per kind, the kinds taking turns; each window "
        f"starts a new tray {settle_s:g} s before it (imports, the first reads); cells: median "
        "(min–max, n). CPU is user + system time of the process (all threads) over the "
        "window's wall time, from psutil."
    )
    report.note(
        f"{leases} leases of 2 MiB held by 5 holder processes, each lease renewed every 10 s "
        f"(ttl 30 s); the broker enrolled at a local `rbroker-server serve` (SQLite) and "
        f"reporting, {COMPUTERS - 1} other computers copied from its row (their reports stop, "
        "so they show as last known); one simulated 24 GiB GPU sampled at the broker's default "
        "interval."
    )
    report.finish(args.record)
    return 0


def fleet_ready(coordinator: LocalCoordinator, computer_id: str, data_dir: Path) -> None:
    """Wait for the broker's first report, then copy its row to make the group's 20
    computers, and read them as the tray does (signed with the broker's key in `data_dir`).

    Raises:
        RuntimeError: no report from the broker within 60 s, or the tray's read of the fleet
            does not list the 20 computers.
    """
    from _coord_fixture import clone_computers

    from rbroker_server.db import engine as db
    from rbroker_server.settings import Settings

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            computers = coordinator.fleet().get("computers", [])
            if any(c.get("id") == computer_id and c.get("reports_applied") for c in computers):
                break
        time.sleep(0.5)
    else:
        raise RuntimeError("the broker did not report to the coordinator within 60 s")
    engine = db.make_engine(Settings.load(coordinator.data_dir).db_url)
    try:
        clone_computers(engine, computer_id, COMPUTERS - 1)
    finally:
        engine.dispose()
    from rbroker.tray.fleet import UplinkFleet

    listed = len(UplinkFleet(data_dir).computers())
    if listed != COMPUTERS:
        raise RuntimeError(
            f"the tray's read of the fleet lists {listed} computers, not {COMPUTERS}"
        )


if __name__ == "__main__":
    sys.exit(main())
