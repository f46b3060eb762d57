"""`rbroker broker install-system` / `uninstall-system`: for real on this computer (accounts
made with useradd and removed), with the files in a temporary root (`--root`, the packagers'
option); the unit written verifies with `systemd-analyze verify`, and its `ExecStart=` runs as
written as the service's account, with the root's /run and /var/lib mounted in their places
(a mount and network namespace of the test's own) and the fake NVIDIA driver standing in for
the GPUs; a user of the allowed group reaches it with `rbroker status`, one outside is
refused. Then a second install upgrades in place, the uninstall keeps the state directory,
and --purge removes it.

Needs root, useradd, runuser and unshare; skips cleanly without them. The unit's program is
one other accounts can run (`tests.system_units.program`); where none can be had (this
environment's packages in a private home directory), running it is left out, the test skipped
saying so after the rest has run."""

from __future__ import annotations

import os
import pwd
import secrets
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rbroker.cli.main import build_parser, main
from rbroker_protocol import system_install as si
from tests.conftest import short_tmp
from tests.fakes import nvml_driver
from tests.os_users import OsUser, create_group, create_user, remove_user
from tests.system_units import (
    accounts,
    as_root,
    cli,
    env,
    exec_start,
    mode,
    owner,
    program,
    runnable_by,
    verify,
)

pytestmark = pytest.mark.contract


def _runexec_start(root: Path, argv: list[str], users: dict[str, OsUser]) -> str:
    """The unit's ExecStart= `argv` as the account rbroker, the root's /run and /var/lib in
    their places; `rbroker status` as each of `users` while it runs. The transcript."""
    if (
        shutil.which("unshare") is None
        or subprocess.run(
            ["unshare", "--mount", "--net", "true"], capture_output=True, check=False
        ).returncode
    ):
        pytest.skip("needs unshare --mount --net (root) to put the root's /run in place")
    driver = short_tmp()
    driver.chmod(0o755)
    library = nvml_driver.linux_library()
    scenario = textwrap.dedent(nvml_driver.GPU_CHECK_SCENARIO)
    state = nvml_driver.write_state(driver / "driver.state", scenario)
    state.chmod(0o644)
    env_cmd = shlex.join(
        ["env", "-u", "RBROKER_BROKER_LOCK", f"PYTHONPATH={env()['PYTHONPATH']}",
         f"LD_LIBRARY_PATH={library}", f"{nvml_driver.STATE_ENV}={state}"]
    )  # fmt: skip
    status = [str(program("rbroker")), "status"]
    script = [
        "set -u",
        f"mount --bind {shlex.quote(str(root / 'run'))} /run",
        f"mount --bind {shlex.quote(str(root / 'var' / 'lib'))} /var/lib",
        f"runuser -u rbroker -- {env_cmd} {shlex.join(argv)} >/run/broker.log 2>&1 &",
        "broker=$!",
        "for _ in $(seq 300); do",
        "  if [ -S /run/rbroker/broker.sock ] || ! kill -0 $broker 2>/dev/null; then break; fi",
        "  sleep 0.1",
        "done",
    ]
    for name, user in users.items():
        script += [
            f"echo '== {name}'",
            f'runuser -u {user.name} -- {env_cmd} {shlex.join(status)} 2>&1; echo "rc=$?"',
        ]
    script += ["kill -TERM $broker; wait $broker", "echo '== broker'; cat /run/broker.log"]
    try:
        out = subprocess.run(
            ["unshare", "--mount", "--net", "sh", "-c", "\n".join(script)],
            capture_output=True, text=True, timeout=120, cwd="/", check=False,
        )  # fmt: skip
    finally:
        shutil.rmtree(driver, ignore_errors=True)
    return out.stdout + out.stderr


@as_root
def test_install_runs_upgrades_and_uninstalls_the_system_broker(tmp_path: Path) -> None:
    group = f"rbt-{secrets.token_hex(3)}"
    admins = f"{group}-adm"
    with accounts("rbroker", group, admins):
        _install_run_upgrade_uninstall(tmp_path / "root", group, admins)


def _install_run_upgrade_uninstall(root: Path, group: str, admins: str) -> None:
    rbroker = program("rbroker")
    args = ["--root", str(root), "--exec", str(rbroker), "--allowed-group", group]
    done = cli("broker", "install-system", *args, "--admin-group", admins,
                "--members", f"vision=alice,@{group}")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "make the system account rbroker" in done.stdout

    service = pwd.getpwnam("rbroker")
    assert service.pw_shell == "/usr/sbin/nologin" and service.pw_uid < 1000
    unit = root / "etc/systemd/system/rbroker-broker.service"
    assert mode(unit) == 0o644
    assert (root / "etc/systemd/system/multi-user.target.wants/rbroker-broker.service").is_symlink()
    run_dir, state_dir = root / "run/rbroker", root / "var/lib/rbroker"
    assert (mode(run_dir), owner(run_dir)) == (0o755, "rbroker")
    assert (mode(state_dir), owner(state_dir)) == (0o750, "rbroker")
    assert 'vision = ["alice", "@' in (state_dir / "broker.toml").read_text()
    argv = exec_start(unit)
    assert argv[0] == str(rbroker)
    parsed = build_parser().parse_args(argv[1:])
    assert parsed.system and (parsed.allowed_group, parsed.admin_group) == (group, admins)
    text = unit.read_text()
    made = f"# made by install-system: account=rbroker groups=rbroker,{group},{admins}"
    assert text.startswith(made)
    assert "User=rbroker" in text and "ProtectSystem=strict" in text
    verify(unit)

    # the unit's program, as written, as its account; a member and an outsider ask it
    unrunnable = not runnable_by("rbroker", rbroker)
    if not unrunnable:
        _member_reaches_it(root, argv, group)
        assert (state_dir / "broker.sqlite3").is_file()
    else:
        (state_dir / "broker.sqlite3").write_bytes(b"")  # as the broker would leave it
        os.chown(state_dir / "broker.sqlite3", service.pw_uid, service.pw_gid)

    # a second install is an upgrade in place: the state stays, the unit is written anew;
    # one that would overwrite broker.toml changes nothing
    clash = cli("broker", "install-system", *args, "--members", "nlp=bob")
    assert clash.returncode == 2 and clash.stdout == "", clash
    assert clash.stderr.count("\n") == 1 and "broker.toml exists already" in clash.stderr
    again = cli("broker", "install-system", *args, "--admin-group", admins)
    assert again.returncode == 0, again.stderr
    assert "upgrade it in place" in again.stdout
    assert "make the system account" not in again.stdout
    assert unit.read_text().startswith(made)
    assert (state_dir / "broker.sqlite3").is_file()

    # the guide's next step puts users into the account's group; userdel then keeps that
    # group for them, and the next install failed (useradd: group rbroker exists)
    member = create_user("rbt")
    try:
        subprocess.run(["usermod", "-aG", "rbroker", member.name], check=True, capture_output=True)
        removed = cli("broker", "uninstall-system", "--root", str(root))
    finally:
        remove_user(member)
    assert removed.returncode == 0, removed.stderr
    assert f"remove the group rbroker (its members {member.name} leave it)" in removed.stdout
    assert not unit.exists() and not run_dir.exists()
    assert not (root / "etc/systemd/system/multi-user.target.wants/rbroker-broker.service").exists()
    for name in ("rbroker", group, admins):
        assert subprocess.run(["getent", "group", name], capture_output=True).returncode == 2
    assert subprocess.run(["getent", "passwd", "rbroker"], capture_output=True).returncode == 2
    kept = sorted(p.name for p in state_dir.iterdir())
    assert "broker.sqlite3" in kept and "broker.toml" in kept, kept
    assert "kept " in removed.stdout
    # root's while no account owns it: the next system account made may get the freed uid
    assert owner(state_dir) == "root" and owner(state_dir / "broker.sqlite3") == "root"

    # installed again over the kept state, into a group of that name an administrator made
    # (a new account, maybe another uid): the state is its own again, the group not its own
    create_group("rbroker")
    back = cli("broker", "install-system", "--root", str(root), "--exec", str(rbroker))
    assert back.returncode == 0, back.stderr
    assert "make the system account rbroker (no login) in the existing group rbroker" in back.stdout
    assert unit.read_text().startswith("# made by install-system: account=rbroker groups=\n")
    assert owner(state_dir / "broker.sqlite3") == "rbroker"
    purged = cli("broker", "uninstall-system", "--root", str(root), "--purge")
    assert purged.returncode == 0, purged.stderr
    assert not state_dir.exists()
    assert subprocess.run(["getent", "passwd", "rbroker"], capture_output=True).returncode == 2
    # the administrator's group stays
    assert subprocess.run(["getent", "group", "rbroker"], capture_output=True).returncode == 0
    if unrunnable:
        pytest.skip(
            f"all but running the unit's program: rbroker cannot run {program('rbroker')} here"
        )


def _member_reaches_it(root: Path, argv: list[str], group: str) -> None:
    alice, carol = create_user("rbt"), create_user("rbt")
    try:
        subprocess.run(["usermod", "-aG", group, alice.name], check=True, capture_output=True)
        said = _runexec_start(root, argv, {"alice": alice, "carol": carol})
    finally:
        remove_user(alice)
        remove_user(carol)
    member, outsider = said.split("== alice", 1)[1].split("== carol", 1)
    assert "broker: /run/rbroker/broker.sock" in member and "rc=0" in member, said
    assert "GPU-5a1e0000-0000-0000-0000-000000000002" in member, said  # the fake driver's
    assert "not allowed to use the broker" in outsider and "rc=2" in outsider, said


def test_not_root_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(sys, "platform", "linux")
    for action in ("install-system", "uninstall-system"):
        assert main(["broker", action]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "run it as root (sudo)" in err, err
    # a dry run only reads: any user may see what it would do
    assert main(["broker", "uninstall-system", "--dry-run"]) == 0
    assert "nothing installed" in capsys.readouterr().out


def test_bad_input_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (
        ["--allowed-group", "9x"],
        ["--admin-group", "a b"],
        ["--members", "vision"],
        ["--members", "vision=@"],
        ["--exec", "relative/rbroker"],
        ["--bogus"],
        ["--everyone", "--allowed-group", "gpu-users"],  # one or the other
        ["--allowed-group", "sudo"],  # the service account would join it
        ["--allowed-group", "root"],
        ["--allowed-group", "disk"],
    ):
        try:
            code = main(["broker", "install-system", "--dry-run", *argv])
        except SystemExit as exc:  # argparse's own refusal
            code = int(exc.code or 0)
        assert code == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err, (argv, err)


def test_members_unknown_here_are_warned_of(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A misspelt name would keep the project from the one it was meant for: said, one
    line each (a user a directory service adds later is fine: not refused)."""
    argv = ["--members", "vision=no-such-user-zz,@no-such-group-zz,root", "--root", str(tmp_path)]
    assert main(["broker", "install-system", "--dry-run", *argv]) == 0
    err = capsys.readouterr().err.splitlines()
    assert [line.split(" on this")[0] for line in err] == [
        "rbroker: warning: --members: no user no-such-user-zz",
        "rbroker: warning: --members: no group no-such-group-zz",
    ]


def test_the_unit_keeps_the_template_but_the_account_and_program() -> None:
    template = si.unit_template("rbroker-broker.service")
    service = si.Service("rbroker-broker.service", "rbroker", ["/opt/x y/rbroker", "broker"])
    made = si.Made("rbroker", ["g1", "g2"])
    text = si.render_unit(template, service, made, "9.9")
    assert si.Made.parse(text) == made
    assert "ExecStart='/opt/x y/rbroker' broker\n" in text
    assert "useradd" not in text  # the hand install's comment is left out
    for line in template.splitlines():
        if line and not line.startswith(("#", "ExecStart=")):
            assert line in text.splitlines(), line
    assert si.Made.parse("[Unit]\n") == si.Made()
