"""Real OS users for multi-user tests: create one, run code as it, remove it.

Needs root (CI runs as root); `other_user` skips cleanly without it. Code runs as the other
user in a forked child that drops to its uid, gid and supplementary groups, so the kernel
reports that user to the broker (SO_PEERCRED) exactly as for a process that user started; the
child needs no access to this interpreter's files on disk.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import secrets
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest


@dataclass(frozen=True)
class OsUser:
    """A real OS account made for a test."""

    name: str
    uid: int
    gid: int


def create_user(prefix: str = "rbt", home: Path | None = None) -> OsUser:
    """`useradd` a system account named `PREFIX-<6 hex digits>`, without a login shell, its
    home `home` (not made) or none. The name is noted for the run's leftover check
    (`tests.leftovers.note_account`), with the test that made it.

    Raises:
        subprocess.CalledProcessError: useradd failed.
    """
    import pwd

    from tests.leftovers import note_account

    name = f"{prefix}-{secrets.token_hex(3)}"
    where = ["--home-dir", str(home)] if home is not None else ["--no-create-home"]
    subprocess.run(
        ["useradd", "--system", *where, "--shell", "/usr/sbin/nologin", name],
        check=True,
        capture_output=True,
    )
    note_account(name)
    entry = pwd.getpwnam(name)
    return OsUser(name, entry.pw_uid, entry.pw_gid)


def create_group(name: str) -> str:
    """`groupadd` a system group `name`, noted for the run's leftover check like an account;
    the test removes it (`groupdel`).

    Raises:
        subprocess.CalledProcessError: groupadd failed.
    """
    from tests.leftovers import note_account

    subprocess.run(["groupadd", "--system", name], check=True, capture_output=True)
    note_account(name)
    return name


PROCESSES_EXIT_S = 5.0
"""How long `remove_user` lets an account's processes end on their own before it kills them."""


def processes_of(uid: int) -> dict[int, str]:
    """Pid → command line (or `[name]`) of every process whose real, effective, saved or
    file-system uid is `uid`, zombies included (userdel counts them too); Linux's /proc."""
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:  # ended meanwhile
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if uid in {int(x) for x in fields.get("Uid", "").split()}:
            name = fields.get("Name", "?").strip()
            found[int(entry.name)] = (
                cmdline.replace(b"\0", b" ").decode(errors="replace").strip() or f"[{name}]"
            )
    return found


def _wait_gone(uid: int, timeout_s: float) -> dict[int, str]:
    """Wait up to `timeout_s` for `uid`'s processes to end; those left (pid → command line)."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = processes_of(uid)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def remove_user(user: OsUser) -> None:
    """Remove the account after its processes are gone, then its group where one is left.

    A process still running as `user` is given `PROCESSES_EXIT_S` to end, then killed and
    waited for: the account is removed all the same, and the error names what was left.

    Raises:
        RuntimeError: processes of `user` outlived the test (each named by pid and command
            line); one outlived SIGKILL for 10 s; or userdel or groupdel failed (with its own
            message). All in one line.
    """
    import grp

    left = _wait_gone(user.uid, PROCESSES_EXIT_S)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    stuck = _wait_gone(user.uid, 10.0) if left else {}
    problems: list[str] = []
    if stuck:
        named = "; ".join(f"pid {pid} {cmd}" for pid, cmd in stuck.items())
        problems.append(f"processes of {user.name} outlived SIGKILL for 10 s: {named}")
    else:
        done = subprocess.run(["userdel", user.name], capture_output=True, text=True)
        if done.returncode != 0:
            problems.append(f"userdel {user.name} failed: {done.stderr.strip()}")
        try:
            grp.getgrnam(user.name)
        except KeyError:
            pass  # userdel removed it with the account (USERGROUPS_ENAB), or there was none
        else:
            done = subprocess.run(["groupdel", user.name], capture_output=True, text=True)
            if done.returncode != 0:
                problems.append(f"groupdel {user.name} failed: {done.stderr.strip()}")
    if left:
        named = "; ".join(f"pid {pid} {cmd}" for pid, cmd in left.items())
        problems.insert(0, f"processes of {user.name} outlived the test (killed): {named}")
    if problems:
        raise RuntimeError(" / ".join(problems))


def run_as(user: OsUser, fn: Callable[..., Any], *args: Any, timeout_s: float = 60.0) -> Any:
    """Run `fn(*args)` in a forked child as `user`; return its result or raise its error.

    Raises:
        RuntimeError: the child failed (with its traceback) or ran past `timeout_s`.
    """
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(read_fd)
        status = 0
        try:
            os.setgroups(os.getgrouplist(user.name, user.gid))  # as a login would
            os.setgid(user.gid)
            os.setuid(user.uid)
            payload = pickle.dumps(("ok", fn(*args)))
        except BaseException:
            payload = pickle.dumps(("error", traceback.format_exc()))
            status = 1
        with os.fdopen(write_fd, "wb") as out:
            out.write(payload)
        os._exit(status)
    os.close(write_fd)
    import select

    chunks = []
    with os.fdopen(read_fd, "rb") as src:
        while True:
            ready, _, _ = select.select([src], [], [], timeout_s)
            if not ready:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                raise RuntimeError(f"code run as {user.name} took more than {timeout_s} s")
            chunk = src.read1(1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
    os.waitpid(pid, 0)
    kind, value = pickle.loads(b"".join(chunks))
    if kind == "error":
        raise RuntimeError(f"code run as {user.name} failed:\n{value}")
    return value


def recreate_user(user: OsUser) -> OsUser:
    """Remove `user` (`remove_user`) and make an account of the same name with another uid,
    as an administrator who re-creates a departed colleague's login for a newcomer would.

    Raises:
        RuntimeError: as `remove_user`; subprocess.CalledProcessError: useradd failed.
    """
    import pwd

    remove_user(user)
    taken = {entry.pw_uid for entry in pwd.getpwall()}
    uid = next(u for u in range(user.uid + 17, user.uid + 10_000) if u not in taken)
    subprocess.run(
        [
            "useradd",
            "--system",
            "--no-create-home",
            "--uid",
            str(uid),
            "--shell",
            "/usr/sbin/nologin",
            user.name,
        ],
        check=True,
        capture_output=True,
    )
    entry = pwd.getpwnam(user.name)
    return OsUser(user.name, entry.pw_uid, entry.pw_gid)


def open_to_everyone(*paths: str | os.PathLike[str]) -> None:
    """Let any local user reach a broker socket: its directories 0755, the socket 0666."""
    for path in paths:
        mode = 0o666 if os.path.exists(path) and not os.path.isdir(path) else 0o755
        os.chmod(path, mode)


REPO = Path(__file__).resolve().parents[1]


def python_as(user: str) -> list[str] | None:
    """A command line that runs `python -m rbroker` as `user`: this interpreter when `user`
    can reach it, else the system's interpreter of the same version with this environment's
    packages added; None when neither works (the interpreter lives in a private home)."""
    site = sysconfig.get_paths()["purelib"]
    boot = (
        f"import runpy, site, sys; site.addsitedir({site!r}); sys.argv[0] = 'rbroker'; "
        "runpy.run_module('rbroker', run_name='__main__', alter_sys=True)"
    )
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    candidates = [[sys.executable, "-m", "rbroker"]]
    system = shutil.which(version, path="/usr/local/bin:/usr/bin")
    if system:
        candidates.append([system, "-c", boot])
    for cmd in candidates:
        probe = subprocess.run(
            ["runuser", "-u", user, "--", "env", f"PYTHONPATH={REPO}", *cmd, "--help"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd="/",
            check=False,
        )
        if probe.returncode == 0:
            return cmd
    return None


@pytest.fixture
def other_user() -> Iterator[OsUser]:
    """A fresh OS account other than the one running the tests (root only)."""
    if sys.platform == "win32" or os.geteuid() != 0 or shutil.which("useradd") is None:
        pytest.skip("needs root and useradd to create a second OS user")
    user = create_user()
    try:
        yield user
    finally:
        remove_user(user)
