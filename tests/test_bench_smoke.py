"""Smoke check of bench/: each benchmark runs with --quick and prints its results table.

Only that they run is checked; their numbers are never asserted (architecture.md §10).
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.contract  # it starts processes or servers of its own

BENCH = Path(__file__).resolve().parent.parent / "bench"
TABLE_HEADER = "| figure | value | floor / anchor | ratio | target | verdict |"
COORDINATOR_SMALL = ["--repeats", "1", "--computers", "5", "--fleet", "10", "--rounds", "4"]
FLEET_PAGE_SMALL = ["--computers", "5", "--leases", "10", "--seconds", "2"]
FLEET_PAGE_SMALL += ["--slow", "30", "--slow-seconds", "1"]
"""Counts below --quick's: the smoke check runs each step once; the benchmarks themselves
burn the CPU they measure, and the suite runs beside them."""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("script", "extra"),
    [
        ("lease_cycle.py", ["--clients", "4", "--cycles", "100", "--seconds", "0.5"]),
        ("transport_cycle.py", ["--cycles", "50", "--warmup", "10"]),
        # 100 timed cycles (--quick's): over 30 the broker's CPU at one live lease, read in
        # the OS's 10 ms ticks, was sometimes 0 and the ratios against it a division by zero
        ("scaling.py", ["--cycles", "100"]),
        ("heartbeats.py", ["--seconds", "1"]),
        ("broker_idle.py", ["--seconds", "1"]),
        ("broker_idle.py", ["--seconds", "1", "--tick-s", "1"]),  # the tick experiment
        ("crash_release.py", ["--repeat", "3"]),
        ("coordinator.py", ["--no-pg", "--generator", "wrk", *COORDINATOR_SMALL]),
        ("coordinator.py", ["--no-pg", "--generator", "httpx", *COORDINATOR_SMALL]),
        ("web_refresh.py", ["--computers", "10", "--requests", "3"]),
        ("fleet_page.py", FLEET_PAGE_SMALL),
        ("abuse.py", ["--busy", "40"]),
        ("eta.py", ["--requests", "80"]),
        ("bookings.py", ["--cycles", "50", "--bookings", "100"]),
        ("idle_sampling.py", []),
        ("startup.py", []),
        ("tray_idle.py", ["--seconds", "1"]),
    ],
)
def test_benchmark_runs_quick(script: str, extra: list[str]) -> None:
    if (
        script in ("coordinator.py", "web_refresh.py", "fleet_page.py", "abuse.py")
        and importlib.util.find_spec("litestar") is None
    ):
        pytest.skip("the coordinator benchmark needs rbroker[server]")
    if script == "tray_idle.py" and not all(
        importlib.util.find_spec(m) for m in ("litestar", "PySide6")
    ):
        pytest.skip("the tray benchmark needs rbroker[desktop] and rbroker[server]")
    if "wrk" in extra and shutil.which("wrk") is None:
        pytest.skip("wrk is not installed (apt-get install wrk; .ci/run installs it)")
    done = subprocess.run(
        [sys.executable, str(BENCH / script), "--quick", *extra],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=BENCH.parent,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert TABLE_HEADER in done.stdout
    assert "Machine: " in done.stdout and " cores, " in done.stdout
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ")]
    assert len(rows) >= 3, done.stdout  # header + at least two figures
    if script == "coordinator.py":
        generator = extra[extra.index("--generator") + 1]
        assert f"Load generator: {generator} (" in done.stdout, done.stdout
        # every pre-built report was sent once, in seq order per computer: all applied
        runs = re.findall(r"SQLite: \d+ HTTP runs .*?: ([\d,]+) applied, ([\d,]+) not applied, "
                          r"([\d,]+) errors", done.stdout)  # fmt: skip
        assert runs and runs[0][0] != "0" and runs[0][1:] == ("0", "0"), done.stdout
