"""Child processes that do not outlive the rbroker process that started them.

One way to start them on every OS, so callers never branch on the platform:

- `spawn(cmd, new_group=…, **popen_kw)`: `subprocess.Popen` plus `bind_to_parent`;
- `popen_kwargs(new_group)`: the `Popen` keyword arguments that do it at start (POSIX: a
  `preexec_fn` with PR_SET_PDEATHSIG on Linux and, with `new_group`, its own process group;
  Windows: `CREATE_NEW_PROCESS_GROUP` with `new_group`);
- `bind_to_parent(proc)`: after start, on Windows, put `proc` in a Job object of its own that
  has JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE and whose only handle this process holds: when this
  process ends (also killed by TerminateProcess), the job closes and Windows ends `proc` and
  every process it started since; a no-op on POSIX, where `popen_kwargs` did the work;
- `kill_tree(proc)`: end `proc` at once with what it started: its job (Windows), its process
  group when it leads one (POSIX), else `proc` alone.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys

from rbroker.base.lazy import Logger

TYPE_CHECKING = False  # typing.TYPE_CHECKING's idiom (PEP 484): no `typing` at run time
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any

log = Logger(__name__)  # logging.getLogger(__name__) once it says something

if sys.platform == "win32":
    HARD_KILL: int = signal.SIGTERM
    HARD_KILL_NAME = "TerminateProcess"
    STOP_SIGNALS: tuple[int, ...] = (signal.SIGTERM, signal.SIGBREAK)
    CONSOLE_SIGNALS: tuple[int, ...] = (signal.SIGINT, signal.SIGBREAK)
else:
    HARD_KILL = signal.SIGKILL
    HARD_KILL_NAME = "SIGKILL"
    STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
    CONSOLE_SIGNALS = ()
# HARD_KILL: the signal for `Popen.send_signal` that ends a child at once: SIGKILL on POSIX;
# on Windows SIGTERM, which `Popen.send_signal` turns into TerminateProcess (no SIGKILL there).
# HARD_KILL_NAME: what a message calls that way of ending a process.
# STOP_SIGNALS: signals besides SIGINT that ask an rbroker command to stop (SIGHUP: the
# terminal closed; Windows has no SIGHUP, its Ctrl-Break is SIGBREAK, and SIGTERM only comes
# from `signal.raise_signal` inside the process).
# CONSOLE_SIGNALS: the signals a Windows console sends to every process of its process group
# (Ctrl-C, Ctrl-Break): a child started without its own group got them already, so they are
# not forwarded to it (none on POSIX, where a terminal's signals are forwarded).

PR_SET_PDEATHSIG = 1
"""prctl(2) option: the signal this process gets when the thread that forked it exits."""

JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE = 0x2000
"""winnt.h: the job's processes end when its last handle closes."""

_jobs: dict[int, Any] = {}
"""Windows: pid → the handle of its Job object (`bind_to_parent`); only this process holds it."""


def die_with_parent() -> None:  # pragma: no cover - runs in the child, before exec
    """Linux: this process gets SIGTERM when its parent dies without cleaning up (also on
    kill -9 of the parent). A no-op elsewhere. For `preexec_fn` (POSIX only: on Windows use
    `bind_to_parent`) and a process pool's `initializer`: it only calls prctl."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _own_group_and_die_with_parent() -> None:  # pragma: no cover - runs in the child
    if sys.platform != "win32":  # a `preexec_fn`: POSIX only
        os.setpgid(0, 0)
    die_with_parent()


def popen_kwargs(new_group: bool = False) -> dict[str, Any]:
    """`subprocess.Popen` keyword arguments for a child that does not outlive this process
    (complete it with `bind_to_parent(proc)` after the start; `spawn` does both).

    `new_group`: the child leads its own process group (POSIX: `setpgid`, so `kill_tree`
    reaches what it starts; Windows: CREATE_NEW_PROCESS_GROUP, so a console's Ctrl-C does
    not reach it and CTRL_BREAK_EVENT can be sent to it alone)."""
    if sys.platform == "win32":
        return {"creationflags": subprocess.CREATE_NEW_PROCESS_GROUP} if new_group else {}
    fn: Callable[[], None] = _own_group_and_die_with_parent if new_group else die_with_parent
    return {"preexec_fn": fn}


def bind_to_parent(proc: subprocess.Popen[Any]) -> None:
    """Windows: put `proc` in a new Job object that ends it (and every process it starts
    afterwards) when this process ends or `kill_tree` is called. A no-op on POSIX and for a
    process that has exited. Where Windows refuses (a job of the caller's that forbids
    nesting), `proc` stays unbound and that is logged: it still runs."""
    if sys.platform != "win32" or proc.poll() is not None:
        return
    import pywintypes
    import win32api
    import win32con
    import win32job

    try:
        # the stubs say CreateJobObject returns None; it returns the job's PyHANDLE
        job: Any = win32job.CreateJobObject(None, "")  # type: ignore[func-returns-value]
        info = win32job.QueryInformationJobObject(job, win32job.JobObjectExtendedLimitInformation)
        info["BasicLimitInformation"]["LimitFlags"] |= JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE
        win32job.SetInformationJobObject(job, win32job.JobObjectExtendedLimitInformation, info)
        handle = win32api.OpenProcess(
            win32con.PROCESS_SET_QUOTA | win32con.PROCESS_TERMINATE, False, proc.pid
        )
        try:
            win32job.AssignProcessToJobObject(job, handle)
        finally:
            win32api.CloseHandle(handle)
    except pywintypes.error as exc:
        log.warning("child %d is not bound to this process (%s)", proc.pid, exc.strerror)
        return
    _jobs[proc.pid] = job


def spawn(cmd: Sequence[str], *, new_group: bool = False, **popen_kw: Any) -> subprocess.Popen[Any]:
    """`subprocess.Popen(cmd, **popen_kw)` as a child that does not outlive this process
    (`popen_kwargs(new_group)` then `bind_to_parent`).

    Raises:
        OSError: the command cannot be started (as `subprocess.Popen`).
    """
    proc: subprocess.Popen[Any] = subprocess.Popen(cmd, **popen_kw, **popen_kwargs(new_group))
    bind_to_parent(proc)
    return proc


def kill_tree(proc: subprocess.Popen[Any]) -> None:
    """End `proc` at once with the processes it started: on Windows its job's, also those
    left after `proc` exited (TerminateJobObject; `proc` alone by TerminateProcess when it is
    not bound); on POSIX SIGKILL to its process group when it leads one, else to `proc`
    (nothing once it has been reaped: use `signal_tree` for a group that outlives its leader)."""
    if sys.platform == "win32":
        job = _jobs.pop(proc.pid, None)
        if job is not None:
            import pywintypes
            import win32job

            with contextlib.suppress(pywintypes.error):
                win32job.TerminateJobObject(job, 1)
            job.Close()
        if proc.returncode is None:
            with contextlib.suppress(OSError):
                proc.kill()
        return
    if proc.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if os.getpgid(proc.pid) == proc.pid:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()


def signal_tree(proc: subprocess.Popen[Any], signum: int) -> None:
    """Send `signum` to the process group that `proc` leads (started with `new_group`), also
    after `proc` itself exited (POSIX). Windows sends no signals to other processes (but the
    console's Ctrl-C/Ctrl-Break): there it is `kill_tree(proc)`, whatever `signum`."""
    if sys.platform == "win32":
        kill_tree(proc)
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signum)


def forward_signal(proc: subprocess.Popen[Any], signum: int) -> None:
    """Pass a stop signal this process received on to its child `proc` (started by `spawn`
    without a group of its own): on POSIX `signum` itself; on Windows nothing for Ctrl-C and
    Ctrl-Break (`CONSOLE_SIGNALS`: the console sent them to `proc` too, which handles them
    as it would without rbroker), and `kill_tree` for any other (Windows has no way to ask a
    process to stop but the console's). Nothing when `proc` has exited."""
    if proc.poll() is not None:
        return
    if sys.platform != "win32":
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signum)
    elif signum not in CONSOLE_SIGNALS:
        kill_tree(proc)
