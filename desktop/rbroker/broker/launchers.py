"""Holder identity through launcher processes (Windows venvs, `py.exe`, console scripts).

On Windows a virtual environment's `Scripts\\python.exe` is not the interpreter: it is a
small launcher that starts the base installation's `python.exe` as its child and waits for
it; `py.exe` does the same, and so do the `.exe` shims that pip and uv write for console
scripts (`Scripts\\rbroker.exe`). The process that runs Python code — that opens the
broker's pipe and allocates GPU memory — is the interpreter at the bottom of that chain. A
process a person started and sees (the launcher) and the one the driver lists (the
interpreter) must be one holder:

- `interpreter_of(tree, pid)` walks *down* from a launcher to the interpreter it started
  (through several launchers: shim → venv launcher → interpreter), so a holder recorded as
  a launcher is the interpreter that does the work;
- `ancestors(tree, pid)` walks *up* with the start-time check Windows needs (a parent pid
  is kept after the parent exits, and pids are reused: a "parent" that started after its
  child is another process), so memory of the interpreter counts for a launcher's lease.

A launcher is recognised by what it is, not by what it does: `py.exe`/`pyw.exe`, or any
`.exe` in a `Scripts` folder (venv launchers, console-script shims), whose single live
child is a Python interpreter with another image. Everything here is pure over a recorded
`ProcessRecord` table; `snapshot_around(pid)` takes one from the running system.
"""

from __future__ import annotations

import ntpath
import os
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import psutil

PY_LAUNCHERS = frozenset({"py.exe", "pyw.exe"})
"""The Python launcher for Windows (PEP 397)."""

PROCESS_QUERY_LIMITED_INFORMATION = 0x1000
"""winnt.h: the access right QueryFullProcessImageNameW needs (granted more widely than
PROCESS_QUERY_INFORMATION, which psutil's image path needs)."""

MAX_HOPS = 8
"""Launchers in a row followed at most (a cycle or a fork bomb never hangs the broker)."""


@dataclass(frozen=True, slots=True)
class ProcessRecord:
    """One process: `exe` is the image path ("" when unreadable), `create_time` in Unix
    seconds (`psutil.Process.create_time()`), `ppid` as the OS reports it (maybe stale)."""

    pid: int
    ppid: int
    name: str
    exe: str
    create_time: float


ProcessTree = Mapping[int, ProcessRecord]


def _is_interpreter(rec: ProcessRecord) -> bool:
    name = rec.name.lower()
    return name.endswith(".exe") and (name.startswith("python") or name.startswith("pythonw"))


def is_launcher_image(rec: ProcessRecord) -> bool:
    """True for `py.exe`/`pyw.exe` and any `.exe` in a `Scripts` folder."""
    name = rec.name.lower()
    if name in PY_LAUNCHERS:
        return True
    folder = ntpath.basename(ntpath.dirname(rec.exe)).lower()
    return folder == "scripts" and name.endswith(".exe")


def parent_of(tree: ProcessTree, rec: ProcessRecord) -> ProcessRecord | None:
    """`rec`'s parent when it is still the process that started `rec` (started no later)."""
    parent = tree.get(rec.ppid)
    if parent is None or parent.pid == rec.pid or parent.create_time > rec.create_time:
        return None
    return parent


def children_of(tree: ProcessTree, rec: ProcessRecord) -> list[ProcessRecord]:
    """The processes `rec` started (by ppid, with the start-time check)."""
    return [
        c for c in tree.values() if c.ppid == rec.pid and c.pid != rec.pid and parent_of(tree, c)
    ]


def launched_interpreter(tree: ProcessTree, rec: ProcessRecord) -> ProcessRecord | None:
    """The interpreter launcher `rec` started, or None when `rec` is no launcher (or has
    started no interpreter yet, or several children: then it does more than launch)."""
    if not is_launcher_image(rec):
        return None
    kids = children_of(tree, rec)
    if len(kids) != 1:
        return None
    child = kids[0]
    if not _is_interpreter(child) and not is_launcher_image(child):
        return None
    if child.exe and rec.exe and ntpath.normcase(child.exe) == ntpath.normcase(rec.exe):
        return None  # the same image again: a program starting itself, not a launcher hop
    return child


def interpreter_of(tree: ProcessTree, pid: int) -> int:
    """The pid that runs the Python code of process `pid`: `pid` itself unless it is a
    launcher, else (transitively) the interpreter it started. Unknown pids map to
    themselves."""
    rec = tree.get(pid)
    for _ in range(MAX_HOPS):
        if rec is None:
            break
        nxt = launched_interpreter(tree, rec)
        if nxt is None:
            return rec.pid
        rec = nxt
    return rec.pid if rec is not None else pid


def ancestors(tree: ProcessTree, pid: int) -> Iterator[ProcessRecord]:
    """`pid`'s record, then each parent that really started its child, up to the root."""
    rec = tree.get(pid)
    seen: set[int] = set()
    while rec is not None and rec.pid not in seen:
        seen.add(rec.pid)
        yield rec
        rec = parent_of(tree, rec)


def same_holder(tree: ProcessTree, holder_pid: int, gpu_pid: int) -> bool:
    """True when GPU memory of `gpu_pid` belongs to the lease held by `holder_pid` (the
    process on the pipe): `gpu_pid` is the holder's interpreter, the holder, or started by
    either (descendants by the checked parent chain)."""
    holder = interpreter_of(tree, holder_pid)
    up = {rec.pid for rec in ancestors(tree, gpu_pid)}
    return holder in up or holder_pid in up


def image_path(proc: psutil.Process) -> str:
    """The image (executable) path of `proc`, "" when it cannot be read.

    psutil first; where it fails (on Windows it raises AccessDenied for some processes of
    other accounts, or OSError where NtQuerySystemInformation's process image class is
    missing, as under Wine), Windows' QueryFullProcessImageNameW, which needs only
    PROCESS_QUERY_LIMITED_INFORMATION."""
    try:
        return str(proc.exe())
    except (psutil.Error, OSError):
        pass
    if sys.platform == "win32":
        return _query_image_name(proc.pid)
    return ""


def _query_image_name(pid: int) -> str:
    """QueryFullProcessImageNameW of `pid` (Windows), "" when refused or gone."""
    import ctypes
    from ctypes import wintypes

    kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)  # type: ignore[attr-defined,unused-ignore]
    kernel32.OpenProcess.restype = wintypes.HANDLE
    kernel32.OpenProcess.argtypes = [wintypes.DWORD, wintypes.BOOL, wintypes.DWORD]
    kernel32.QueryFullProcessImageNameW.restype = wintypes.BOOL
    kernel32.QueryFullProcessImageNameW.argtypes = [
        wintypes.HANDLE, wintypes.DWORD, wintypes.LPWSTR, ctypes.POINTER(wintypes.DWORD)
    ]  # fmt: skip
    kernel32.CloseHandle.argtypes = [wintypes.HANDLE]
    handle = kernel32.OpenProcess(PROCESS_QUERY_LIMITED_INFORMATION, False, pid)
    if not handle:
        return ""
    try:
        size = wintypes.DWORD(32768)
        buf = ctypes.create_unicode_buffer(size.value)
        if not kernel32.QueryFullProcessImageNameW(handle, 0, buf, ctypes.byref(size)):
            return ""
        return str(buf.value)
    finally:
        kernel32.CloseHandle(handle)


def process_record(proc: psutil.Process) -> ProcessRecord:
    """`proc` as a `ProcessRecord`; its name is the image path's file name where psutil
    cannot read the name (see `image_path`).

    Raises:
        psutil.Error: the process is gone, or its parent or start time cannot be read.
    """
    with proc.oneshot():
        exe = image_path(proc)
        try:
            name = str(proc.name())
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            raise
        except (psutil.Error, OSError):
            name = ntpath.basename(exe) if sys.platform == "win32" else os.path.basename(exe)
        return ProcessRecord(proc.pid, proc.ppid(), name, exe, proc.create_time())


def snapshot_around(pid: int) -> dict[int, ProcessRecord]:
    """Records of `pid`, its ancestors and its descendants from the running system (what
    `interpreter_of`, `ancestors` and `same_holder` need); unreadable processes are left
    out, unreadable image paths are ""."""
    out: dict[int, ProcessRecord] = {}

    def add(proc: psutil.Process) -> None:
        try:
            out[proc.pid] = process_record(proc)
        except (psutil.Error, OSError):
            return

    try:
        root = psutil.Process(pid)
    except psutil.Error:
        return out
    add(root)
    try:
        family = [*root.parents(), *root.children(recursive=True)]
    except (psutil.Error, OSError):
        family = []
    for proc in family:
        add(proc)
    return out
