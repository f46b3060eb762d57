"""`rbroker broker` and `rbroker tray` that cannot start: one line on stderr with the fix and
a distinct exit code (docs/user-guide.md "Exit codes"), never a traceback.

Real commands run as subprocesses. Permission denied is real: as root, the command runs
without CAP_DAC_OVERRIDE (`setpriv`), so a 0555 directory refuses it as it would refuse any
user; a read-only file system is a read-only bind mount in a private mount namespace (root).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rbroker_protocol.startup import (
    EXIT_PATH_TOO_LONG,
    EXIT_PERMISSION,
    EXIT_READ_ONLY,
    EXIT_USAGE,
    SOCKET_PATH_MAX_BYTES,
)
from tests.conftest import short_tmp

pytestmark = pytest.mark.contract  # it starts processes or servers of its own

IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
NO_DAC = [
    "setpriv",
    "--inh-caps=-dac_override,-dac_read_search",
    "--bounding-set=-dac_override,-dac_read_search",
]


@pytest.fixture
def root() -> Iterator[Path]:
    path = short_tmp()
    yield path
    for p in (path, *path.rglob("*")):
        if p.is_dir() and not p.is_symlink():
            p.chmod(0o755)
    shutil.rmtree(path, ignore_errors=True)


def _rbroker(*args: str, prefix: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    env.pop("RBROKER_SOCKET", None)
    return subprocess.run(
        [*(prefix or []), sys.executable, "-m", "rbroker", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def _one_line(done: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


def _long_socket(root: Path) -> str:
    deep = root / ("job-" + "d" * 60) / ("step-" + "e" * 40)
    path = str(deep / "broker.sock")
    assert len(path.encode()) > SOCKET_PATH_MAX_BYTES == 107
    return path


def _denied_dir(root: Path) -> tuple[Path, list[str]]:
    """A directory this test's commands may not write, and the prefix that makes it so."""
    locked = root / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    if IS_ROOT:
        if shutil.which("setpriv") is None:
            pytest.skip("setpriv (util-linux) is needed to run without CAP_DAC_OVERRIDE")
        return locked, NO_DAC
    return locked, []


@pytest.mark.parametrize("command", ["broker", "tray"])
def test_socket_path_over_the_os_limit(root: Path, command: str) -> None:
    sock = _long_socket(root)
    # before: `OSError: AF_UNIX path too long` in a traceback, exit code 1
    done = _rbroker(command, "--simulate", "--socket", sock, "--data-dir", str(root / "data"))
    line = _one_line(done)
    assert done.returncode == EXIT_PATH_TOO_LONG == 10
    prog = "rbroker tray" if command == "tray" else "rbroker"
    n = len(sock.encode())
    assert line == (
        f"{prog}: cannot start: the socket path is {n} bytes, over the OS limit of 107 for "
        f"Unix sockets: {sock}; choose a shorter socket path with --socket (or "
        "RBROKER_SOCKET), e.g. under $XDG_RUNTIME_DIR"
    )


@pytest.mark.parametrize("command", ["broker", "tray"])
@pytest.mark.parametrize("where", ["socket dir", "new data dir", "data dir"])
def test_permission_denied(root: Path, command: str, where: str) -> None:
    locked, prefix = _denied_dir(root)
    sock = locked / "run" / "b.sock" if where == "socket dir" else root / "b.sock"
    data = {"new data dir": locked / "data", "data dir": locked}.get(where, root / "data")
    args = ["--simulate", "--socket", str(sock), "--data-dir", str(data)]
    done = _rbroker(command, *args, prefix=prefix)
    line = _one_line(done)
    assert done.returncode == EXIT_PERMISSION == 11
    denied = sock.parent if where == "socket dir" else data
    assert f"cannot start: Permission denied: '{denied}" in line  # the broker: its lock file
    assert "--socket and --data-dir" in line


@pytest.mark.skipif(not IS_ROOT or shutil.which("unshare") is None, reason="needs root")
def test_read_only_data_dir(root: Path) -> None:
    ro = root / "ro"
    ro.mkdir()
    script = (
        f"mount --bind {ro} {ro} && mount -o remount,bind,ro {ro} && "
        f"exec {sys.executable} -m rbroker broker --simulate --socket {root / 'b.sock'} "
        f"--data-dir {ro / 'data'}"
    )
    done = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
    )
    line = _one_line(done)
    assert done.returncode == EXIT_READ_ONLY == 13
    assert line.startswith(f"rbroker: cannot start: Read-only file system: '{ro / 'data'}'; ")


def test_bad_arguments_keep_code_2_in_one_line(root: Path) -> None:
    long_args = ["--capacity-mib", "GPU-" + "x" * 120]  # longer than a terminal line
    done = _rbroker("broker", "--simulate", "--socket", str(root / "b.sock"), *long_args)
    line = _one_line(done)
    assert done.returncode == EXIT_USAGE == 2
    assert line.startswith("rbroker: --capacity-mib wants UUID=MIB, got 'GPU-xxx")


@pytest.mark.parametrize(
    ("text", "words"),
    [("[[gpu]\n", "not valid TOML"), ("[[gpu]]\ntotal_mib = -1\n", "total_mib")],
    ids=["not-toml", "bad-value"],
)
def test_a_bad_scenario_file_is_named(root: Path, text: str, words: str) -> None:
    """Before: "bad scenario: scenario is not valid TOML: ..." without the file's path."""
    scenario = root / "my-scenario.toml"
    scenario.write_text(text)
    args = ["--simulate", str(scenario), "--socket", str(root / "b.sock")]
    done = _rbroker("broker", *args, "--data-dir", str(root / "data"))
    line = _one_line(done)
    assert done.returncode == 1, done.stderr
    assert line.startswith(f"rbroker: bad scenario: {scenario}: "), line
    assert words in line
    missing = root / "missing.toml"
    args = ["--simulate", str(missing), "--socket", str(root / "b.sock")]
    done = _rbroker("broker", *args, "--data-dir", str(root / "data"))
    assert done.returncode == 1
    assert _one_line(done).startswith(f"rbroker: bad scenario: {missing}: cannot read it")


@pytest.mark.parametrize(("headroom_mib", "said"), [("24576", "24 576"), ("999999", "999 999")])
def test_a_headroom_not_below_the_gpus_total_is_refused_with_the_numbers(
    root: Path, headroom_mib: str, said: str
) -> None:
    """The default scenario's GPUs hold 24 576 MiB each: a headroom of that much or more
    would leave nothing to grant, so the broker refuses to start and says why."""
    from rbroker.demo.processes import broker_address

    done = _rbroker(
        "broker",
        "--simulate",
        "--headroom-mib",
        headroom_mib,
        "--socket",
        broker_address(root),
        "--data-dir",
        str(root / "data"),
    )
    assert done.returncode == EXIT_USAGE, done.stderr
    line = _one_line(done)
    assert line.startswith(f"rbroker: headroom {said} MiB is not below the 24 576 MiB of GPU 0 ")
    assert "--headroom-mib" in line


def test_the_start_banner_keeps_one_line_per_gpu_when_piped(root: Path) -> None:
    """Piped (a journal, a log file), rich would wrap at 80 columns; each GPU stays one line."""
    from rbroker.demo.processes import broker_address

    proc = subprocess.Popen(
        [sys.executable, "-m", "rbroker", "broker", "--simulate", "--socket",
         broker_address(root), "--data-dir", str(root / "data")],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "COLUMNS": "80"},
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        lines = [proc.stderr.readline() for _ in range(4)]
    finally:
        proc.terminate()
        proc.wait(30)
        if proc.stderr is not None:
            proc.stderr.close()
    gpu_lines = [line for line in lines if line.startswith("  GPU ")]
    assert len(gpu_lines) == 2, lines
    for line in gpu_lines:
        assert "24 576 MiB total, headroom 1 229 MiB, telemetry" in line, lines
    assert lines[-1].startswith("rbroker broker listening on "), lines
