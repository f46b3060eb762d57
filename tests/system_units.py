"""The systemd services' installs (`rbroker broker install-system`, `rbroker-server
install-system`) as their tests run them: for real on this computer, as root, accounts made
by the install and removed after the test whatever happened, the files in a temporary root
(`--root`), each unit checked with `systemd-analyze verify`."""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import pwd
import shlex
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.os_users import REPO

as_root = pytest.mark.skipif(
    not sys.platform.startswith("linux")
    or os.geteuid() != 0
    or shutil.which("useradd") is None
    or shutil.which("runuser") is None,
    reason="needs Linux, root, useradd and runuser to make the service's accounts",
)


@functools.cache
def program(name: str) -> Path:
    """The installed program `name` (`rbroker`, `rbroker-server`) that the units' ExecStart=
    name and that other accounts can run: this environment's launcher where `nobody` can run
    it; else one in a virtual environment made (once per process) from the system's
    interpreter of this version, with this environment's packages added (a .pth file), as
    tests/os_users.py's `python_as` runs code as another account. Where neither can be run
    by others (the packages in a private home directory), this environment's launcher: the
    tests leave out running it, saying so."""
    own = Path(sys.executable).with_name(name)
    if runnable_by("nobody", own):
        return own
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    system = shutil.which(version, path="/usr/local/bin:/usr/bin")
    if system is None:
        return own
    folder = Path(tempfile.mkdtemp(prefix="rbt-venv-"))
    folder.chmod(0o755)
    atexit.register(shutil.rmtree, folder, True)
    made = subprocess.run(
        [system, "-m", "venv", "--without-pip", str(folder)], capture_output=True, check=False
    )
    if made.returncode != 0:
        return own
    paths = sysconfig.get_paths()
    ask = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    answer = subprocess.run(
        [str(folder / "bin" / "python"), "-c", ask], capture_output=True, text=True, check=True
    )
    site = Path(answer.stdout.strip())
    site.joinpath("rbroker-tests.pth").write_text(f"{paths['purelib']}\n{paths['platlib']}\n")
    module = {"rbroker": "rbroker.cli.main", "rbroker-server": "rbroker_server.cli.main"}
    for script, where in module.items():
        launcher = folder / "bin" / script
        launcher.write_text(
            f"#!{folder / 'bin' / 'python'}\nimport sys\nfrom {where} import main\n"
            "sys.exit(main())\n"
        )
        launcher.chmod(0o755)
    return folder / "bin" / name


def env() -> dict[str, str]:
    path = os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(REPO)]))
    return {**os.environ, "PYTHONPATH": path}


def cli(*args: str, module: str = "rbroker") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env(),
        cwd="/",
        check=False,
    )


def verify(unit: Path) -> None:
    """`systemd-analyze verify` passes on `unit` (required under CI: .ci/run installs it)."""
    if shutil.which("systemd-analyze") is None:
        reason = "needs systemd-analyze (Debian: systemd)"
        if os.environ.get("CI"):
            pytest.fail(reason + " (.ci/run installs it)")
        pytest.skip(reason)
    out = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert unit.name not in out.stderr, out.stderr


def exec_start(unit: Path) -> list[str]:
    lines = [ln for ln in unit.read_text().splitlines() if ln.startswith("ExecStart=")]
    assert len(lines) == 1, lines
    return shlex.split(lines[0].removeprefix("ExecStart="))


def runnable_by(user: str, program: Path) -> bool:
    probe = subprocess.run(
        ["runuser", "-u", user, "--", "env", f"PYTHONPATH={env()['PYTHONPATH']}",
         str(program), "--version"],
        capture_output=True, cwd="/", timeout=60, check=False,
    )  # fmt: skip
    return probe.returncode == 0


@contextlib.contextmanager
def accounts(account: str, *groups: str) -> Iterator[None]:
    """Around a test whose install makes the account `account` and the `groups`: skips
    where `account` exists before it (the install would take it as the operator's own); after
    it, whatever is left of them is removed (the uninstall is the test's own subject)."""
    try:
        pwd.getpwnam(account)
    except KeyError:
        pass
    else:
        pytest.skip(f"an account named {account} exists on this computer; the test makes its own")
    from tests.leftovers import note_account

    for name in (account, *groups):
        note_account(name)
    try:
        yield
    finally:
        subprocess.run(["userdel", account], capture_output=True, check=False)
        for name in (*groups, account):
            subprocess.run(["groupdel", name], capture_output=True, check=False)


def gone(database: str, name: str) -> bool:
    """`name` is not in the account or group database (`getent`'s exit code 2)."""
    return subprocess.run(["getent", database, name], capture_output=True).returncode == 2


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def owner(path: Path) -> str:
    return pwd.getpwuid(path.stat().st_uid).pw_name
