"""Process start times on a clock that no wall-clock step moves.

On Linux a process's start is the kernel's own figure, clock ticks since boot
(`/proc/PID/stat` field 22). psutil's `create_time()` adds the boot time, which it re-reads
from `/proc/stat` `btime`, which the kernel derives from the wall clock: a step of the clock
(NTP, `date -s`, a VM resumed from a snapshot) moved every process's start, and a pid +
start identity taken before the step no longer matched the same process after it
(psutil#2526). Windows and macOS keep a process's creation time as stored when it began,
which later steps do not move: there psutil's figure is used.

`process_clock_s()` reads "now" on the same clock, so that a sample's time and a process's
start compare (`CLOCK_BOOTTIME` on Linux, the clock of /proc's start ticks; Unix time
elsewhere). Since-boot figures repeat after a reboot: a store keeps `holder_clock()` beside
them (`rbroker.broker.restore`).
"""

from __future__ import annotations

import functools
import os
import sys
import time

import psutil

_LINUX = sys.platform.startswith("linux")
CLK_TCK = 100
"""Clock ticks per second of /proc's figures (sysconf(_SC_CLK_TCK), 100 on every Linux)."""
if sys.platform.startswith("linux"):
    CLK_TCK = os.sysconf("SC_CLK_TCK")


def _linux_start_s(pid: int) -> float:
    """Seconds from boot to the start of `pid` (`/proc/PID/stat` starttime / CLK_TCK).

    Raises:
        psutil.NoSuchProcess: no such process, or /proc hides it (hidepid).
        psutil.AccessDenied: /proc/PID/stat cannot be read.
    """
    return linux_stat(pid)[0]


def linux_stat(pid: int) -> tuple[float, str]:
    """`(start, state)` of `pid` from one read of `/proc/PID/stat` (Linux): its start in
    seconds from boot (starttime / CLK_TCK, as `start_s`) and its state letter (`R`, `S`,
    `Z` for a zombie, … as `ps` shows it), for checks that need both without psutil's three
    reads of /proc (the broker's holder checks, several times a second).

    Raises:
        psutil.NoSuchProcess: no such process, or /proc hides it (hidepid).
        psutil.AccessDenied: /proc/PID/stat cannot be read.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except (FileNotFoundError, ProcessLookupError):
        raise psutil.NoSuchProcess(pid) from None
    except PermissionError:
        raise psutil.AccessDenied(pid) from None
    try:  # the name in parentheses may hold spaces and ')': fields follow the last ')'
        fields = data[data.rindex(b")") + 2 :].split()
        return int(fields[19]) / CLK_TCK, fields[0].decode("ascii")
    except (ValueError, IndexError, UnicodeDecodeError):
        raise psutil.NoSuchProcess(pid) from None  # exited while it was read


def start_s(proc: psutil.Process) -> float:
    """When `proc` started, in seconds on a clock no wall-clock step moves: since boot on
    Linux, the creation time the OS stored elsewhere (see the module docstring).

    Raises:
        psutil.NoSuchProcess, psutil.AccessDenied: as psutil does.
    """
    if _LINUX:
        return _linux_start_s(proc.pid)
    return float(proc.create_time())


def process_clock_s() -> float:
    """Now, on the clock of `start_s` (seconds)."""
    if sys.platform.startswith("linux"):
        return time.clock_gettime(time.CLOCK_BOOTTIME)
    return time.time()


@functools.cache
def holder_clock() -> str:
    """What this computer's start times mean, stored beside them so that a restart can tell
    whether they still compare: `since-boot <boot id>` on Linux (the kernel's random boot
    id, new at every boot), `create-time` elsewhere. Read once: a process lives in one boot
    (it is asked at every connection's authority check and every job write)."""
    if _LINUX:
        try:
            with open("/proc/sys/kernel/random/boot_id") as f:
                return f"since-boot {f.read().strip()}"
        except OSError:
            return "since-boot unknown"
    return "create-time"
