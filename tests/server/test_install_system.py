"""`rbroker-server install-system` / `uninstall-system`: the coordinator's unit installed
for real on this computer (its account made and removed) into a temporary root (`--root`),
verified with `systemd-analyze verify`, its ExecStart= the coordinator's own command line;
the uninstall keeps the data dir."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rbroker_server.cli.main import build_parser
from tests.system_units import (
    accounts,
    as_root,
    cli,
    env,
    exec_start,
    gone,
    mode,
    owner,
    program,
    runnable_by,
    verify,
)


@as_root
def test_the_coordinator_installs_and_uninstalls(tmp_path: Path) -> None:
    with accounts("rbroker-server"):
        _install_uninstall(tmp_path / "root")


def _install_uninstall(root: Path) -> None:
    server = program("rbroker-server")
    args = ["install-system", "--root", str(root), "--exec", str(server)]
    done = cli(*args, module="rbroker_server")
    assert done.returncode == 0, done.stderr
    assert "not started: /var/lib/rbroker-server has no config.toml" in done.stdout
    unit = root / "etc/systemd/system/rbroker-server.service"
    data = root / "var/lib/rbroker-server"
    assert (mode(data), owner(data)) == (0o750, "rbroker-server")
    argv = exec_start(unit)
    assert argv == [
        str(server),
        "serve",
        "--data-dir",
        "/var/lib/rbroker-server",
    ]
    assert build_parser().parse_args(argv[1:]).command == "serve"
    assert "User=rbroker-server" in unit.read_text()
    verify(unit)
    runnable = runnable_by("rbroker-server", server)
    if runnable:
        said = _setup_and_serve(root, argv)
        assert "healthz 200" in said, said
        assert (data / "config.toml").is_file()
        again = cli(*args, module="rbroker_server")  # an upgrade, configured: no setup line
        assert again.returncode == 0 and "not started" not in again.stdout, again
    (data / "keep.txt").write_text("x")
    removed = cli("uninstall-system", "--root", str(root), module="rbroker_server")
    assert removed.returncode == 0, removed.stderr
    assert not unit.exists() and (data / "keep.txt").is_file()
    assert gone("passwd", "rbroker-server") and gone("group", "rbroker-server")
    # said also where userdel took the memberless group with the account
    assert "remove the group rbroker-server" in removed.stdout, removed.stdout
    assert "owned by root now" in removed.stdout
    # kept for root: the account's uid is free now, and another account may get it
    assert owner(data) == "root" and owner(data / "keep.txt") == "root"
    if not runnable:
        pytest.skip(f"all but serving: rbroker-server cannot run {program('rbroker-server')} here")


def _setup_and_serve(root: Path, argv: list[str]) -> str:
    """`setup` as the operator guide runs it, then the unit's ExecStart= `argv` as written, as
    rbroker-server, the root's /var/lib in its place and a loopback of the test's own (a mount
    and network namespace); asks /healthz. The transcript."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.skip("needs unshare and ip (iproute2) for a namespace of the test's own")
    port = 8787
    as_service = [
        "runuser",
        "-u",
        "rbroker-server",
        "--",
        "env",
        f"PYTHONPATH={env()['PYTHONPATH']}",
    ]
    setup = [str(program("rbroker-server")), "setup", "--non-interactive", "--data-dir",
             "/var/lib/rbroker-server", "--bind", "127.0.0.1", "--port", str(port)]  # fmt: skip
    probe = (
        "import sys, time, urllib.request\n"
        "for _ in range(300):\n"
        "    try:\n"
        f"        r = urllib.request.urlopen('http://127.0.0.1:{port}/healthz', timeout=2)\n"
        "        print('healthz', r.status); break\n"
        "    except OSError: time.sleep(0.1)\n"
    )
    script = "\n".join(
        [
            "set -u",
            "ip link set lo up",
            f"mount --bind {shlex.quote(str(root / 'var' / 'lib'))} /var/lib",
            f"{shlex.join(as_service + setup)} >/dev/null",
            f"{shlex.join(as_service + argv)} >/tmp/serve.log 2>&1 &",
            "server=$!",
            f"{shlex.join([sys.executable, '-c', probe])}",
            "kill -TERM $server; wait $server",
        ]
    )
    out = subprocess.run(
        ["unshare", "--mount", "--net", "sh", "-c", script],
        capture_output=True, text=True, timeout=120, cwd="/", check=False,
    )  # fmt: skip
    return out.stdout + out.stderr


def test_not_root_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from rbroker_server.cli.main import main

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(sys, "platform", "linux")
    for action in ("install-system", "uninstall-system"):
        assert main([action]) == 2  # bad input's code, as the broker's
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "run it as root (sudo)" in err, err
    # a dry run only reads: any user may see what it would do
    assert main(["uninstall-system", "--dry-run"]) == 0
    assert "nothing installed" in capsys.readouterr().out


@as_root
def test_a_dry_run_changes_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    from rbroker_server.cli.main import main

    with accounts("rbroker-server"):
        assert main(["install-system", "--dry-run", "--exec", "/usr/bin/true"]) == 0
        said = capsys.readouterr().out
        assert "would make the system account rbroker-server" in said
        assert gone("passwd", "rbroker-server")
        assert not Path("/etc/systemd/system/rbroker-server.service").exists()
