"""Shared pieces of the benchmarks: machine header, percentiles, the results table, recording.

Every benchmark prints one markdown table (figure, value, floor/anchor, ratio, target,
verdict) and, with `--record`, appends it to `bench/RESULTS.md` under a header that names the
machine (cores, memory, CPU model, OS, Python), the date and the load average before and
after the run. Nothing here asserts: a benchmark reports, it never fails on a number.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rbroker.demo.processes import SimulatedBroker

if TYPE_CHECKING:
    import rbroker

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
RESULTS = BENCH_DIR / "RESULTS.md"

# The benchmarks build their signed reports as the tests do (tests.fakes.reports), so the
# repository root is importable whichever benchmark runs.
if str(REPO) not in sys.path:
    sys.path.append(str(REPO))

GPU0 = "GPU-5a1e0000-0000-0000-0000-000000000001"
SINGLE_24G = f"""
[[gpu]]
uuid = "{GPU0}"
name = "Simulated RTX 4090"
total_mib = 24576
"""
"""The scenario of the tests: one simulated, empty 24 576 MiB GPU."""


# ---------------------------------------------------------------- machine and load


def cpu_model() -> str:
    """The CPU model name (from /proc/cpuinfo on Linux, else `platform`)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown"


def memory_gib() -> float:
    """Total memory in GiB."""
    try:
        import psutil

        return float(psutil.virtual_memory().total) / 2**30
    except ImportError:  # pragma: no cover - psutil is a base dependency
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30


def loadavg() -> str:
    """The 1/5/15-minute load average, or 'n/a' (also on Windows, which has none)."""
    try:
        one, five, fifteen = os.getloadavg()
    except (OSError, AttributeError):
        return "n/a"
    return f"{one:.2f} / {five:.2f} / {fifteen:.2f}"


def machine_line() -> str:
    """One line naming the machine's size: cores, memory, CPU model, OS, Python."""
    return (
        f"{os.cpu_count()} cores, {memory_gib():.1f} GiB memory, {cpu_model()}, "
        f"{platform.system()} {platform.release()}, "
        f"Python {platform.python_version()} ({platform.python_implementation()})"
    )


def now_utc() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


# ---------------------------------------------------------------- statistics


def percentile(values: Sequence[float], p: float) -> float:
    """The nearest-rank `p`-th percentile (0 < p <= 100) of `values` (NaN when empty)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def median(values: Sequence[float]) -> float:
    """The median of `values` (NaN when empty or when any is NaN)."""
    if not values or any(math.isnan(v) for v in values):
        return math.nan
    return statistics.median(values)


def spread(values: Sequence[float], fmt: Callable[[float], str]) -> str:
    """`median (min–max over n)` of repeated measurements, each formatted with `fmt`."""
    if not values:
        return "n/a"
    if len(values) == 1:
        return fmt(values[0])
    return f"{fmt(median(values))} ({fmt(min(values))}–{fmt(max(values))}, n={len(values)})"


def per_round(values: Sequence[float], bases: Sequence[float]) -> list[float]:
    """Each round's ratio `value / base` (the rounds in the same order in both)."""
    return [v / b for v, b in zip(values, bases, strict=True)]


def interleaved(
    runs: Mapping[str, Callable[[], None]], n: int, warmup: int, slices: int = 10
) -> dict[str, list[float]]:
    """Durations (s) of `n` calls of each of `runs` (kind → one cycle), after `warmup`
    untimed ones of each; the kinds (in the order of `runs`) take turns in `slices` slices,
    so that load elsewhere hits them alike."""
    out: dict[str, list[float]] = {kind: [] for kind in runs}
    for run in runs.values():
        for _ in range(warmup):
            run()
    clock = time.perf_counter
    for s in range(slices):
        for kind, run in runs.items():
            times = out[kind]
            for _ in range(n // slices + (1 if s < n % slices else 0)):
                t0 = clock()
                run()
                times.append(clock() - t0)
    return out


def fmt_x(value: float) -> str:
    """A ratio as `1.23×`."""
    return "n/a" if math.isnan(value) else f"{value:.2f}×"


def fmt_us(seconds: float) -> str:
    """Seconds as microseconds (or milliseconds above 10 ms), for the table."""
    if math.isnan(seconds):
        return "n/a"
    if seconds >= 0.01:
        return f"{seconds * 1e3:,.1f} ms"
    return f"{seconds * 1e6:,.0f} µs"


def fmt_ms(seconds: float) -> str:
    if math.isnan(seconds):
        return "n/a"
    return f"{seconds * 1e3:,.1f} ms"


def fmt_rate(per_s: float, unit: str = "/s") -> str:
    if math.isnan(per_s):
        return "n/a"
    return f"{per_s:,.0f}{unit}"


def ratio(value: float, base: float) -> str:
    """`value / base` as '2.31×' (n/a when either is missing)."""
    if math.isnan(value) or math.isnan(base) or base == 0:
        return "n/a"
    return f"{value / base:.2f}×"


def verdict(ok: bool | None) -> str:
    """'meets' / 'misses' / '—' (no target)."""
    if ok is None:
        return "—"
    return "meets" if ok else "**misses**"


# ---------------------------------------------------------------- the table


@dataclass
class Row:
    """One line of a results table."""

    figure: str
    value: str
    floor: str = "—"
    ratio: str = "—"
    target: str = "—"
    verdict: str = "—"


@dataclass
class Report:
    """A benchmark's results: a title, rows, and notes printed under the table."""

    title: str
    quick: bool
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    load_before: str = field(default_factory=loadavg)
    started: str = field(default_factory=now_utc)

    def add(self, *args: str, **kw: str) -> None:
        self.rows.append(Row(*args, **kw))

    def note(self, text: str) -> None:
        self.notes.append(text)

    def markdown(self, load_after: str) -> str:
        mode = "quick mode (smoke check, small counts)" if self.quick else "full mode"
        lines = [
            f"### {self.title} — {self.started}, {mode}",
            "",
            f"Machine: {machine_line()}.  ",
            f"Load average (1/5/15 min): {self.load_before} before, {load_after} after.",
            "",
            "| figure | value | floor / anchor | ratio | target | verdict |",
            "|---|---|---|---|---|---|",
        ]
        for r in self.rows:
            cells = (r.figure, r.value, r.floor, r.ratio, r.target, r.verdict)
            lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        if self.notes:
            lines.append("")
            lines.extend(f"- {n}" for n in self.notes)
        return "\n".join(lines) + "\n"

    def finish(self, record: bool) -> None:
        """Print the table; with `record`, append it to bench/RESULTS.md."""
        text = self.markdown(loadavg())
        print(text, flush=True)
        if record:
            append_results(text)
            print(f"(appended to {RESULTS.relative_to(REPO)})", flush=True)


def append_results(text: str) -> None:
    """Append `text` to bench/RESULTS.md (created with a title when missing)."""
    if not RESULTS.exists():
        RESULTS.write_text(
            "# Benchmark results\n\n"
            "Appended by `python bench/run_all.py --record` (or one benchmark with `--record`);\n"
            "see bench/README.md for what each figure means.\n\n",
            encoding="utf-8",
            newline="\n",
        )
    with RESULTS.open("a", encoding="utf-8", newline="\n") as f:  # \n on Windows too
        f.write("\n" + text)


def parser(description: str) -> argparse.ArgumentParser:
    """The common command line: `--quick` (small counts) and `--record`."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="small counts: a smoke check, not figures")
    p.add_argument(
        "--record", action="store_true", help="append the results table to bench/RESULTS.md"
    )
    return p


# ---------------------------------------------------------------- a lease cycle


def timed_lease_cycle(
    client: rbroker.Client, acquire: Mapping[str, Any], pipelined: bool = False
) -> tuple[float, float, float]:
    """One `lease.acquire` (with `acquire` as its params) + `lease.renew` + `lease.release`
    of the granted lease through `client`; the seconds (perf_counter) each call took. With
    `pipelined`, the renewal is sent as the SDK's heartbeat sends it (`call_nowait`: its
    time is the write's; its answer is read with the release's).

    Raises:
        rbroker.RBrokerError: a call failed (as `Client.call` raises it).
    """
    clock = time.perf_counter
    t0 = clock()
    lid = client.call("lease.acquire", **acquire)["lease"]["lease_id"]
    t1 = clock()
    if pipelined:
        client.call_nowait("lease.renew", lease_id=lid)
    else:
        client.call("lease.renew", lease_id=lid)
    t2 = clock()
    client.call("lease.release", lease_id=lid)
    t3 = clock()
    return t1 - t0, t2 - t1, t3 - t2


# ---------------------------------------------------------------- a real broker process


class Broker(SimulatedBroker):
    """A running `python -m rbroker broker --simulate` process (the tests' helper)."""

    @property
    def root(self) -> Path:
        return self.log_path.parent

    def stop(self) -> str:
        """SIGTERM, then SIGKILL after 10 s; returns a note when it had to be killed."""
        if self.proc.poll() is not None:
            return f"the broker had exited with {self.proc.returncode} before the end"
        if not self.terminate(signal.SIGTERM, 10.0):
            return "the broker did not exit within 10 s of SIGTERM (killed)"
        return ""


def short_tmp(prefix: str = "rbb-") -> Path:
    """A short temporary directory (Unix socket paths are limited to ~100 bytes)."""
    return Path(tempfile.mkdtemp(prefix=prefix))


def start_broker(scenario: str = SINGLE_24G, extra_args: Sequence[str] = ()) -> Broker:
    """Start a simulated broker at its default log level and wait until it answers.

    Raises:
        RuntimeError: it exited or did not answer within 20 s (with its log).
    """
    broker: Broker = Broker.start(scenario, short_tmp(), extra_args)
    return broker


def wait_until_monotonic(t: float) -> None:
    """Sleep until `time.monotonic()` reaches `t` (the clock is shared by processes)."""
    while True:
        left = t - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(left, 0.05))


class StartGate:
    """Start worker processes together: each calls `arrive()` when ready (connected, warm)
    and gets the common start time; the parent's `open()` waits for all, then sets it."""

    def __init__(self, ctx: Any) -> None:
        self._ready = ctx.Queue()
        self._go = ctx.Event()
        self._start = ctx.Value("d", 0.0, lock=False)

    def arrive(self, ok: bool = True) -> float:
        """Say ready (or failed), wait for the start and return it (monotonic seconds)."""
        self._ready.put(ok)
        if not ok:
            return 0.0
        self._go.wait()
        start = float(self._start.value)
        wait_until_monotonic(start)
        return start

    def open(self, workers: int, timeout_s: float = 300.0, delay_s: float = 0.3) -> float:
        """Wait until `workers` arrived, start them `delay_s` from now; returns the start.

        Raises:
            RuntimeError: a worker failed before arriving.
        """
        oks = [self._ready.get(timeout=timeout_s) for _ in range(workers)]
        start = time.monotonic() + delay_s
        self._start.value = start
        self._go.set()
        if not all(oks):
            raise RuntimeError("a worker process failed before the start (see stderr)")
        wait_until_monotonic(start)
        return start
