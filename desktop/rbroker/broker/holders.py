"""Holder processes: identity by pid + start time, liveness, and process-tree attribution.

A lease's holder is the process on the other end of its connection; memory NVML lists for
that process or any of its descendants belongs to the lease. A pid alone is not an
identity (pids are reused), so every check compares the process start time too, read on
a clock that no wall-clock step moves (`rbroker.base.proctime.start_s`).
"""

from __future__ import annotations

import errno
import os
import sys
from dataclasses import dataclass

import psutil

from rbroker.base.proctime import linux_stat, start_s

_LINUX = sys.platform.startswith("linux")


def signal_says_alive(pid: int) -> bool | None:
    """`kill(pid, 0)`: True when a process with `pid` exists (also another user's, EPERM),
    False when none does (ESRCH), None where the OS cannot tell (Windows).

    Used where /proc hides other users' processes (`hidepid=2` on multi-user hosts): the
    broker cannot read them, but may still ask the kernel whether they exist.
    """
    if os.name == "nt":
        return None
    try:
        os.kill(pid, 0)
    except OSError as exc:
        if exc.errno == errno.EPERM:
            return True
        if exc.errno == errno.ESRCH:
            return False
        return None
    return True


@dataclass(frozen=True, slots=True)
class Holder:
    """A process identity: `pid` plus its start time (`rbroker.base.proctime.start_s`, s)."""

    pid: int
    start_time: float

    @classmethod
    def of(cls, pid: int) -> Holder:
        """The identity of running process `pid`; start time 0 when /proc hides it.

        Raises:
            ProcessLookupError: no such process.
        """
        try:
            return cls(pid, start_s(psutil.Process(pid)))
        except psutil.NoSuchProcess:
            if signal_says_alive(pid):  # hidden by hidepid, yet alive
                return cls(pid, 0.0)
            raise ProcessLookupError(pid) from None
        except psutil.AccessDenied:
            return cls(pid, 0.0)

    def alive(self) -> bool:
        """True when a process with this pid *and* start time still runs (zombies are dead).
        On Linux one read of /proc/PID/stat answers it (psutil read it twice and
        /proc/PID/status once: the broker checks every holder four times a second)."""
        if _LINUX and self.pid > 0:
            try:
                start, state = linux_stat(self.pid)
            except psutil.NoSuchProcess:
                return not self.start_time and bool(signal_says_alive(self.pid))
            except psutil.AccessDenied:
                return True
            if self.start_time and start != self.start_time:
                return False
            return state != "Z"
        try:
            proc = psutil.Process(self.pid)
            if self.start_time and start_s(proc) != self.start_time:
                return False
            return bool(proc.status() != psutil.STATUS_ZOMBIE)
        except psutil.NoSuchProcess:
            # /proc may hide another user's process (hidepid): ask the kernel instead
            return not self.start_time and bool(signal_says_alive(self.pid))
        except psutil.AccessDenied:
            return True


#: A process and its ancestors, nearest first: `(itself, parent, grandparent, …)`.
Chain = tuple[Holder, ...]


def lineage(holder: Holder) -> Chain:
    """`holder` and its ancestors, nearest first, as far as they can be read now: who asks,
    for the rule on waiting behind one's own leases (`rbroker.broker.own_leases`).

    The walk stops at a parent that cannot be read or that started after its child (its pid
    was reused: Windows keeps the parent pid of a process whose parent exited); only
    `(holder,)` when the process cannot be read (/proc hidden) or is no longer `holder`.
    """
    members = [holder]
    try:
        proc = psutil.Process(holder.pid)
        start = start_s(proc)
        if holder.start_time and start != holder.start_time:
            return (holder,)
        for parent in proc.parents():  # psutil: the immediate parent first
            parent_start = start_s(parent)
            if parent_start > start:
                break
            members.append(Holder(parent.pid, parent_start))
            start = parent_start
    except psutil.Error:
        pass  # hidden or gone: the chain as far as it was read
    return tuple(members)


class Ancestry:
    """Caches each GPU process's chain of ancestors, as `Holder`s, for attribution."""

    def __init__(self) -> None:
        self._chains: dict[int, tuple[float, Chain]] = {}

    def chain(self, pid: int) -> Chain:
        """The process itself and its ancestors, nearest first (`Chain`); empty when it
        cannot be read. An ancestor whose start time cannot be read is left out."""
        cached = self._chains.get(pid)
        if _LINUX and cached is not None and pid > 0:
            try:  # one read of /proc/PID/stat for a chain known already (every sample)
                if linux_stat(pid)[0] == cached[0]:
                    return cached[1]
            except psutil.Error:
                self._chains.pop(pid, None)
                return ()
        try:
            proc = psutil.Process(pid)
            start = start_s(proc)
        except psutil.Error:
            self._chains.pop(pid, None)
            return ()
        cached = self._chains.get(pid)
        if cached is not None and cached[0] == start:
            return cached[1]
        members = [Holder(pid, start)]
        try:
            for parent in proc.parents():  # psutil: the immediate parent first
                try:
                    members.append(Holder(parent.pid, start_s(parent)))
                except psutil.Error:
                    continue
        except psutil.Error:
            pass
        chain = tuple(members)
        self._chains[pid] = (start, chain)
        return chain

    def forget_except(self, live_pids: set[int]) -> None:
        """Drop cached chains of pids no longer listed on any GPU."""
        for pid in list(self._chains):
            if pid not in live_pids:
                del self._chains[pid]
