"""The leftover check (tests/leftovers.py): a run whose test leaves a process, a listening
socket or an OS account behind fails and names each on a line, and the process is ended; a
clean run passes. Each case is a real pytest run in a child process, with and without xdist.
A run inside this one checks only its own processes (accounts, mounts and sockets are this
run's to check), so the socket and account cases run as runs of their own."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import wait_until
from tests.leftovers import RUN_ENV

ROOT = Path(__file__).resolve().parents[1]

TESTS = textwrap.dedent(
    """
    import os, subprocess, sys
    from pathlib import Path

    SERVE = (
        "import socket, sys, time; s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); "
        "s.listen(); print('ready', flush=True); time.sleep(120)"
    )

    def test_clean():
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        proc.kill()
        proc.wait()

    def test_leaks_a_server(tmp_path):
        sock = os.environ["LEAK_SOCKET"]
        proc = subprocess.Popen([sys.executable, "-c", SERVE, sock], stdout=subprocess.PIPE)
        assert proc.stdout.readline() == b"ready\\n"
        Path(os.environ["LEAK_PID"]).write_text(str(proc.pid))

    def test_leaks_an_account():
        from tests.os_users import create_user

        Path(os.environ["LEAK_ACCOUNT"]).write_text(create_user("rbt-left").name)
    """
)


def _run(
    tmp_path: Path, case: str, *args: str, nested: bool = True
) -> tuple[int, str, dict[str, str]]:
    """Run the test `case` of TESTS with the leftover check as a plugin: (exit status,
    output, the files the case wrote). `nested`: inside this run (its token in the
    environment)."""
    (tmp_path / "test_cases.py").write_text(TESTS)
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["tests.leftovers"]\n')
    files = {name: str(tmp_path / name) for name in ("LEAK_PID", "LEAK_ACCOUNT")}
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "LEAK_SOCKET": str(tmp_path / "leak.sock"),
        **files,
    }
    if not nested:
        env.pop(RUN_ENV, None)
    command = [sys.executable, "-m", "pytest", "-c", os.devnull, "--rootdir", str(tmp_path)]
    command += ["-p", "no:cacheprovider", "-p", "no:randomly", *args]
    proc = subprocess.run(
        [*command, f"{tmp_path / 'test_cases.py'}::{case}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    written = {k: Path(v).read_text() for k, v in files.items() if Path(v).exists()}
    return proc.returncode, proc.stdout + proc.stderr, written


def _gone(pid: int) -> bool:
    try:
        return "(zombie)" in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True


pytestmark = [
    pytest.mark.contract,
    pytest.mark.slow,  # each case is a pytest run of its own, 3 to 18 s on a busy machine
    pytest.mark.skipif(
        not sys.platform.startswith("linux"), reason="the leftover check reads Linux's /proc"
    ),
]


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_clean_run_passes_and_says_what_it_left_to_the_outer_run(
    tmp_path: Path, workers: str
) -> None:
    code, out, _ = _run(tmp_path, "test_clean", "-n", workers)
    assert code == 0, out
    assert "LEFT BEHIND" not in out
    assert "leftover check: inside another run of the suite" in out


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_process_left_behind_fails_the_run_is_named_and_ended(
    tmp_path: Path, workers: str
) -> None:
    code, out, written = _run(tmp_path, "test_leaks_a_server", "-n", workers)
    assert code == 1, out
    pid = int(written["LEAK_PID"])
    lines = [line for line in out.splitlines() if line.startswith("LEFT BEHIND")]
    assert len(lines) == 1, out  # sockets are the outer run's to check
    assert re.match(
        rf"LEFT BEHIND process pid {pid} of \S+, started in "
        r"test_cases\.py::test_leaks_a_server \(call\): .*time\.sleep\(120\).*\(ended\)$",
        lines[0],
    ), out
    assert re.search(r" 1 passed, 1 left behind in ", out), out
    wait_until(lambda: _gone(pid))


def test_a_listening_socket_left_behind_is_named_with_its_process(tmp_path: Path) -> None:
    code, out, written = _run(tmp_path, "test_leaks_a_server", "-n", "0", nested=False)
    assert code == 1, out
    pid = written["LEAK_PID"]
    sock = tmp_path / "leak.sock"
    assert f"LEFT BEHIND listening socket unix {sock}, held by process {pid} (above)" in out
    assert "inside another run" not in out


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("useradd") is None, reason="needs root and useradd"
)
def test_an_account_left_behind_is_named_with_the_test_that_made_it(tmp_path: Path) -> None:
    code, out, written = _run(tmp_path, "test_leaks_an_account", "-n", "0", nested=False)
    name = written.get("LEAK_ACCOUNT", "")
    try:
        assert code == 1, out
        assert name.startswith("rbt-left-"), out
        line = f"LEFT BEHIND account {name} (made in test_cases.py::test_leaks_an_account)"
        assert f"{line}: userdel {name}" in out, out
    finally:
        if name:
            import pwd

            from tests.os_users import OsUser, remove_user

            entry = pwd.getpwnam(name)
            remove_user(OsUser(name, entry.pw_uid, entry.pw_gid))


def test_only_os_users_makes_accounts() -> None:
    """The check counts only the accounts `create_user` noted (a new account it did not note
    is another run's); so no other test file makes one."""
    root = Path(__file__).resolve().parent
    # a command line's first word: ["useradd", ...] or "useradd -r ..." (not which("useradd"))
    makers = re.compile(r"[\"'](useradd|groupadd|adduser|addgroup)([\"']\s*,|\s)")
    elsewhere = [
        path.relative_to(root.parent).as_posix()
        for path in sorted(root.rglob("*.py"))
        if path.name not in ("os_users.py", "test_leftovers.py")
        and makers.search(path.read_text(encoding="utf-8"))
    ]
    assert elsewhere == []


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="mounts in a mount namespace of its own need root and util-linux's unshare",
)
def test_a_mount_left_behind_is_counted_and_iproute2s_netns_directory_is_not(
    tmp_path: Path,
) -> None:
    """In a private mount namespace: a tmpfs mounted after the snapshot is a mount left behind,
    while /run/netns bound on itself (what the first `ip netns add` on a computer makes and
    keeps) is not, so a first run on a new computer does not fail for it."""
    (tmp_path / "disk").mkdir()
    script = textwrap.dedent(
        f"""
        import subprocess, sys
        sys.path.insert(0, {str(ROOT)!r})
        from tests.leftovers import _mounts
        before = _mounts()
        subprocess.run(["mkdir", "-p", "/run/netns"], check=True)
        subprocess.run(["mount", "--bind", "/run/netns", "/run/netns"], check=True)
        subprocess.run(["mount", "-t", "tmpfs", "rbt-tmpfs", {str(tmp_path / "disk")!r}],
                       check=True)
        print("\\n".join(v for k, v in _mounts().items() if k not in before))
        """
    )
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:-1] == [f"{tmp_path / 'disk'} (tmpfs rbt-tmpfs)"]
