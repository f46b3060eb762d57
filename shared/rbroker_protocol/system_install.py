"""Installing a systemd service of rbroker's on Linux in one command, and removing it: the
system broker (`rbroker broker install-system`) and the coordinator (`rbroker-server
install-system`) share this.

An install makes the service account (a system user without a login, its own group) and any
group it is given that is missing, the service's directories with the modes the operator guide
prescribes, and the unit from packaging/linux with its `ExecStart=` naming the `rbroker`
program that runs the install (a virtual environment, `uv tool install`, `pipx install`); with
systemd running it reloads systemd, enables the unit and (re)starts it. Run again it is an
upgrade in place: the unit is rewritten, the state directory and what is in it are kept.

The unit's first line records what the install made (the account, the groups), so that
`uninstall-system` removes only those, and never an account or group that was there before.
The state directory (lease database, enrollment, the coordinator's database) is kept unless
purged; the runtime directory goes.

`root` puts every file under another directory as if it were `/` (for packagers building an
image, and the tests): the unit then names the final paths, systemd is not asked to reload or
start anything, and `systemctl --root` enables the unit in that tree. Accounts are made on this
computer whatever the root (the files' owners must exist).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

UNIT_DIR = Path("etc/systemd/system")
"""Where an installed unit goes, under the root."""
MADE_PREFIX = "# made by install-system:"
"""The unit's first line: what the install made, read back by the uninstall."""
HIDDEN_FROM_SERVICE = ("/home/", "/root/", "/tmp/", "/run/user/", "/var/tmp/")
"""Paths the units' ProtectHome= and PrivateTmp= hide from the service: a program there cannot
be the unit's ExecStart."""
assert sys.platform != "win32", "rbroker_protocol.system_install is for Linux"

_NAME = re.compile(r"[a-z_][a-z0-9_-]{0,31}")


class InstallError(Exception):
    """An install or uninstall cannot go on: one line saying why and what to do; `usage`:
    the command was given what it cannot take (bad input, not root, not Linux)."""

    def __init__(self, text: str, *, usage: bool = False) -> None:
        super().__init__(text)
        self.usage = usage


@dataclass(frozen=True)
class Directory:
    """A directory the service needs: its path from `/`, its mode, owned by the account."""

    path: str
    mode: int
    state: bool = False
    """The state directory: kept by an uninstall unless purged."""


@dataclass(frozen=True)
class Service:
    """One service to install: the unit `unit` (a file name in packaging/linux), run as
    `account` with `exec_start` (argv), the extra groups it needs, its directories."""

    unit: str
    account: str
    exec_start: Sequence[str]
    groups: Sequence[str] = ()
    directories: Sequence[Directory] = ()
    start: bool = True
    """Start (or restart) it after installing; False leaves it enabled but stopped."""
    member_of: Sequence[str] = ()
    """Groups the account must be in (the broker gives its socket to its allowed group)."""


@dataclass
class Made:
    """What an install made: an account, groups (read from and written to the unit)."""

    account: str | None = None
    groups: list[str] = field(default_factory=list)

    def line(self) -> str:
        parts = [f"account={self.account or ''}", f"groups={','.join(self.groups)}"]
        return f"{MADE_PREFIX} {' '.join(parts)}"

    @classmethod
    def parse(cls, text: str) -> Made:
        first = text.partition("\n")[0]
        if not first.startswith(MADE_PREFIX):
            return cls()
        fields = dict(
            item.partition("=")[::2] for item in first[len(MADE_PREFIX) :].split() if "=" in item
        )
        return cls(
            account=fields.get("account") or None,
            groups=[g for g in fields.get("groups", "").split(",") if g],
        )


Say = Callable[[str], None]


def print_step(line: str) -> None:
    """One step's line on stdout; a reader gone (`| head`) does not stop an install halfway:
    the rest goes to the null device."""
    try:
        print(line, flush=True)
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


def check_name(option: str, name: str) -> None:
    """Raise InstallError unless `name` is a plain account or group name."""
    if not _NAME.fullmatch(name):
        raise InstallError(
            f"{option}: {name!r} is not an account or group name (lower-case letters, digits, "
            "_ and -, at most 32, not starting with a digit or -)",
            usage=True,
        )


PRIVILEGED_GROUPS = frozenset(
    {
        "root", "wheel", "sudo", "admin", "adm", "disk", "shadow", "kmem", "mem", "sys",
        "docker", "lxd", "libvirt", "systemd-journal", "staff", "tty", "utmp", "operator",
    }
)  # fmt: skip
"""Groups that give their members more than a GPU broker's socket (root's files, raw
disks, the password hashes, the logs, a root-equivalent container daemon, sudo): the
broker's service account joins its allowed group, so none of these may be that group."""


def check_unprivileged_group(option: str, name: str) -> None:
    """Raise InstallError (usage) when `name` is one of `PRIVILEGED_GROUPS` or gid 0."""
    import grp

    try:
        gid = grp.getgrnam(name).gr_gid
    except KeyError:
        gid = None
    if name in PRIVILEGED_GROUPS or gid == 0:
        raise InstallError(
            f"{option}: {name} gives its members far more than the broker (the service account "
            "would join it): make a group for rbroker's users instead, e.g. --allowed-group "
            "rbroker (made when missing), then usermod -aG rbroker USER",
            usage=True,
        )


def refuse_unless_root(command: str, *, dry_run: bool = False) -> None:
    """Raise InstallError (usage) off Linux, and unless root where it would change anything
    (a dry run only reads: any user may see what an install would do)."""
    if not sys.platform.startswith("linux"):
        raise InstallError(
            f"{command} installs a systemd service and works on Linux only", usage=True
        )
    if os.geteuid() != 0 and not dry_run:
        raise InstallError(
            f"{command} changes accounts and system files: run it as root (sudo)", usage=True
        )


def entry_point(name: str, module: str, given: str | None = None) -> list[str]:
    """The argv that runs the program `name`: `given` (an absolute path), else the one that
    runs now (`sys.argv[0]` when it is `name`), else `name` beside this interpreter, else
    `python -m module`."""
    if given is not None:
        if not os.path.isabs(given):
            raise InstallError(f"--exec: {given!r} is not an absolute path", usage=True)
        return [given]
    argv0 = Path(sys.argv[0])
    if argv0.name == name and argv0.is_file():
        return [str(argv0.absolute())]
    if Path(sys.executable).with_name(name).is_file():
        return [str(Path(sys.executable).with_name(name))]
    return [sys.executable, "-m", module]


def check_runnable(
    argv: Sequence[str], account: str, name: str = "rbroker", wheel: str = "rbroker-*.whl"
) -> None:
    """Raise InstallError (usage) unless the service (as `account`, its home directories and
    /tmp hidden by the unit) can run `argv[0]` and the interpreter its first line names;
    the line says how to install `name` (the program) from `wheel` (the pip argument)."""
    program = Path(argv[0])
    if not program.is_file():
        raise InstallError(
            f"{program} does not exist: give the installed program with --exec", usage=True
        )
    paths = [program, program.resolve()]
    try:
        first = program.read_bytes()[:256].partition(b"\n")[0]
    except OSError:
        first = b""
    if first.startswith(b"#!"):
        interpreter = first[2:].decode(errors="replace").split()
        if interpreter and interpreter[0] != "/usr/bin/env":
            paths += [Path(interpreter[0]), Path(interpreter[0]).resolve()]
    for path in paths:
        text = str(path)
        hidden = text.startswith(HIDDEN_FROM_SERVICE)
        if hidden or not _others_may_run(path):
            why = "the unit hides home directories and /tmp" if hidden else "others may not run it"
            raise InstallError(
                f"the service account {account} could not run {text} ({why}): install rbroker "
                "for the whole computer first, e.g. python3 -m venv /opt/rbroker && "
                f"/opt/rbroker/bin/pip install {shlex.quote(wheel)}, then run "
                f"/opt/rbroker/bin/{name} again (or name such a program with --exec)",
                usage=True,
            )


def _others_may_run(path: Path) -> bool:
    """Every directory above `path` may be entered, and `path` read and run, by any account."""
    try:
        if path.stat().st_mode & 0o005 != 0o005:
            return False
        return all(parent.stat().st_mode & 0o001 for parent in path.parents)
    except OSError:
        return False


def render_unit(template: str, service: Service, made: Made, version: str) -> str:
    """The unit to install: `template` without its leading comment (the hand install it
    describes), the account in User= and Group=, `ExecStart=` the given argv, and the
    first line saying what the install made."""
    lines = template.splitlines()
    while lines and (lines[0].startswith("#") or not lines[0].strip()):
        lines.pop(0)
    exec_line = "ExecStart=" + shlex.join(service.exec_start)
    out = []
    for line in lines:
        key = line.partition("=")[0]
        if key == "ExecStart":
            line = exec_line
        elif key in ("User", "Group"):
            line = f"{key}={service.account}"
        out.append(line)
    header = [
        made.line(),
        f"# rbroker {version}: written by install-system; uninstall-system removes it (and the",
        "# account and groups above), keeping the state directory.",
        "",
    ]
    return "\n".join(header + out) + "\n"


def _run(argv: list[str]) -> None:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    except OSError as exc:
        raise InstallError(f"cannot run {argv[0]}: {exc.strerror or exc}") from exc
    except subprocess.TimeoutExpired as exc:
        raise InstallError(f"{shlex.join(argv)} did not finish in 120 s") from exc
    if out.returncode != 0:
        said = " ".join((out.stderr or out.stdout).split()) or f"exit code {out.returncode}"
        raise InstallError(f"{shlex.join(argv)} failed: {said}")


def systemd_running() -> bool:
    """systemd is this computer's init (sd_booted(3): /run/systemd/system exists)."""
    return Path("/run/systemd/system").is_dir()


def _group_exists(name: str) -> bool:
    import grp

    try:
        grp.getgrnam(name)
    except KeyError:
        return False
    return True


def _user_exists(name: str) -> bool:
    import pwd

    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def _is_member(user: str, group: str) -> bool:
    import grp

    return user in grp.getgrnam(group).gr_mem


def _under(root: Path, path: str) -> Path:
    return root / path.lstrip("/")


def install(
    service: Service,
    template: str,
    version: str,
    *,
    root: Path = Path("/"),
    dry_run: bool = False,
    say: Say = print_step,
    extra_files: Sequence[tuple[str, str]] = (),
) -> None:
    """Install `service` (see the module's docstring); `say` is told each step, as done or,
    with `dry_run`, as what would be done. `extra_files`: (path from /, text) written 0640
    owned by the account where no such file is (the broker's broker.toml).

    Raises:
        InstallError: a step failed (one line); what was done before it stays.
    """
    made = Made()
    try:
        _install(service, template, version, root, dry_run, say, extra_files, made)
    except InstallError as exc:
        new = [made.account] if made.account else []
        new += made.groups
        if not new or dry_run:
            raise
        raise InstallError(
            f"{exc}; made before it and kept, for the next install-system (or remove them by "
            f"hand: userdel, groupdel): {', '.join(new)}",
            usage=exc.usage,
        ) from exc


def _install(
    service: Service,
    template: str,
    version: str,
    root: Path,
    dry_run: bool,
    say: Say,
    extra_files: Sequence[tuple[str, str]],
    made_now: Made,
) -> None:
    verb = "would " if dry_run else ""
    for rel, _text in extra_files:  # before anything changes
        if _under(root, rel).exists():
            raise InstallError(
                f"{_under(root, rel)} exists already: add what it should say to it by hand, or "
                "run install-system again without the options that write it",
                usage=True,
            )
    unit_path = _under(root, str(UNIT_DIR / service.unit))
    previous = Made()
    if unit_path.is_file():
        previous = Made.parse(unit_path.read_text(encoding="utf-8", errors="replace"))
        say(f"{unit_path} is installed already: {verb}upgrade it in place, keeping its state")
    made = Made(account=previous.account, groups=list(previous.groups))
    home = next((d.path for d in service.directories if d.state), "/nonexistent")

    if not _user_exists(service.account):
        # its own group: made with it, or one of that name already there (an earlier
        # uninstall's that kept it for its members, or an administrator's), then joined
        group_there = _group_exists(service.account)
        cmd = ["useradd", "--system", "--home-dir", home, "--no-create-home"]
        cmd += ["-g", service.account] if group_there else ["--user-group"]
        cmd += ["--shell", "/usr/sbin/nologin", service.account]
        there = f" in the existing group {service.account}" if group_there else ""
        say(f"{verb}make the system account {service.account} (no login){there}")
        if not dry_run:
            _run(cmd)
            made_now.account = service.account
            if not group_there:
                made_now.groups.append(service.account)
        made.account = service.account
        if not group_there and service.account not in made.groups:
            made.groups.append(service.account)
    for group in service.groups:
        if group == service.account or _group_exists(group):
            continue
        say(f"{verb}make the group {group}")
        if not dry_run:
            _run(["groupadd", "--system", group])
            made_now.groups.append(group)
        if group not in made.groups:
            made.groups.append(group)

    for group in service.member_of:
        if group == service.account or (not dry_run and _is_member(service.account, group)):
            continue
        say(f"{verb}add {service.account} to the group {group}")
        if not dry_run:
            _run(["usermod", "--append", "--groups", group, service.account])

    for directory in service.directories:
        path = _under(root, directory.path)
        say(f"{verb}make {path} (mode {directory.mode:04o}, owner {service.account})")
        if not dry_run:
            _own_dir(path, service.account, directory.mode, contents=directory.state)
    for rel, text in extra_files:
        path = _under(root, rel)
        say(f"{verb}write {path}")
        if not dry_run:
            _write(path, text, 0o640, service.account)

    text = render_unit(template, service, made, version)
    say(f"{verb}write {unit_path}: ExecStart={shlex.join(service.exec_start)}")
    if not dry_run:
        _write(unit_path, text, 0o644, None)
        made_now.account, made_now.groups = None, []  # recorded in the unit from here on
    name = service.unit
    if root == Path("/") and systemd_running():
        steps = [["systemctl", "daemon-reload"], ["systemctl", "enable", name]]
        if service.start:
            steps.append(["systemctl", "restart", name])
        for step in steps:
            say(f"{verb}{shlex.join(step)}")
            if not dry_run:
                _run(step)
        return
    if shutil.which("systemctl") is not None:
        step = ["systemctl", f"--root={root}", "enable", name]
        say(f"{verb}{shlex.join(step)} (enabled for the next boot)")
        if not dry_run:
            _run(step)
    if root != Path("/"):
        done = "would be installed" if dry_run else "installed"
        say(f"{done} under {root}; systemd was not told (a tree for another system)")
    else:
        say(
            f"{'would write' if dry_run else 'wrote'} the unit, but systemd is not running on "
            f"this computer (it is not process 1), so {name} is not started; run it under "
            f"systemd, or start its ExecStart= as {service.account}"
        )


def uninstall(
    unit: str,
    state_dirs: Sequence[str],
    runtime_dirs: Sequence[str],
    *,
    root: Path = Path("/"),
    purge: bool = False,
    dry_run: bool = False,
    say: Say = print_step,
) -> None:
    """Stop, disable and remove `unit`, its runtime directories and the account and groups
    its install made (its first line); the `state_dirs` too with `purge`.

    Raises:
        InstallError: a step failed (one line).
    """
    verb = "would " if dry_run else ""
    unit_path = _under(root, str(UNIT_DIR / unit))
    if not unit_path.is_file():
        say(f"no {unit_path}: nothing installed to remove")
        if purge:  # what an earlier uninstall kept
            for rel in state_dirs:
                path = _under(root, rel)
                if path.exists():
                    say(f"{verb}remove {path} and everything in it")
                    if not dry_run:
                        shutil.rmtree(path)
        return
    made = Made.parse(unit_path.read_text(encoding="utf-8", errors="replace"))
    if root == Path("/") and systemd_running():
        step = ["systemctl", "disable", "--now", unit]
    elif shutil.which("systemctl") is not None:
        step = ["systemctl", f"--root={root}", "disable", unit]
    else:
        step = []
    if step:
        say(f"{verb}{shlex.join(step)}")
        if not dry_run:
            _run(step)
    say(f"{verb}remove {unit_path}")
    if not dry_run:
        unit_path.unlink()
    if root == Path("/") and systemd_running():
        say(f"{verb}systemctl daemon-reload")
        if not dry_run:
            _run(["systemctl", "daemon-reload"])
    for rel in runtime_dirs:
        path = _under(root, rel)
        if path.is_dir():
            say(f"{verb}remove {path}")
            if not dry_run:
                shutil.rmtree(path)
    for rel in state_dirs:
        path = _under(root, rel)
        if not path.exists():
            continue
        if purge:
            say(f"{verb}remove {path} and everything in it")
            if not dry_run:
                shutil.rmtree(path)
        else:
            # root's from now: the account's uid is free once it goes, and the next system
            # account made would own the leases and the enrollment (a reinstall gives them
            # back to its account)
            owned = "would be owned by root" if dry_run else "owned by root now"
            say(f"kept {path} (the service's state; --purge removes it), {owned}")
            if not dry_run:
                _give_to_root(path)
    there = {group: _group_exists(group) for group in made.groups}
    members = {group: _members(group) for group, yes in there.items() if yes}
    if made.account and _user_exists(made.account):
        say(f"{verb}remove the account {made.account}")
        if not dry_run:
            keep = made.account not in made.groups and _group_exists(made.account)
            spare = _spare_group() if keep else None
            if spare is not None:
                # userdel removes a group named as the account that is its primary one (and
                # has no other member), whoever made it: the group was there before the
                # install, so the account leaves it first
                _run(["usermod", "-g", spare, made.account])
            _run(["userdel", made.account])
    for group in made.groups:
        if not there[group]:
            continue
        users = members[group]
        also = f" (its members {', '.join(users)} leave it)" if users else ""
        say(f"{verb}remove the group {group}{also}")
        if not dry_run and _group_exists(group):  # userdel removes a memberless user group
            _run(["groupdel", group])


def _spare_group() -> str | None:
    """The group of no one (`nogroup` on Debian, `nobody` elsewhere), None where neither is."""
    for name in ("nogroup", "nobody"):
        if _group_exists(name):
            return name
    return None


def _members(group: str) -> list[str]:
    import grp

    try:
        return sorted(grp.getgrnam(group).gr_mem)
    except KeyError:
        return []


def _give_to_root(path: Path) -> None:
    """`path` and everything in it owned by root:root, modes kept (no link followed)."""
    try:
        os.chown(path, 0, 0, follow_symlinks=False)
        for base, dirs, files in os.walk(path):
            for name in dirs + files:
                os.chown(Path(base) / name, 0, 0, follow_symlinks=False)
    except OSError as exc:
        raise InstallError(f"cannot give {path} to root: {exc.strerror or exc}") from exc


def _own_dir(path: Path, account: str, mode: int, *, contents: bool) -> None:
    """`path` made (parents 0755) or kept, owned by `account` with `mode`; with `contents`,
    what is inside goes to `account` too (an uninstall that kept the state gave it to root,
    and an account made again has another uid)."""
    import pwd

    entry = pwd.getpwnam(account)
    try:
        path.mkdir(mode=0o755, parents=True, exist_ok=True)
        if path.is_symlink() or not path.is_dir():
            raise InstallError(f"{path} is not a directory: move it aside")
        os.chown(path, entry.pw_uid, entry.pw_gid)
        path.chmod(mode)
        if contents:
            for base, dirs, files in os.walk(path):
                for name in dirs + files:
                    os.chown(Path(base) / name, entry.pw_uid, entry.pw_gid, follow_symlinks=False)
    except OSError as exc:
        raise InstallError(f"cannot make {path}: {exc.strerror or exc}") from exc


def _write(path: Path, text: str, mode: int, account: str | None) -> None:
    """`text` into `path` whole (a new file renamed over it), `mode`, owned by `account` (root
    when None)."""
    import pwd

    tmp = path.with_name(f".{path.name}.new")
    try:
        path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            os.fchmod(f.fileno(), mode)
            if account is not None:
                entry = pwd.getpwnam(account)
                os.fchown(f.fileno(), entry.pw_uid, entry.pw_gid)
        os.replace(tmp, path)
    except OSError as exc:
        raise InstallError(f"cannot write {path}: {exc.strerror or exc}") from exc


def unit_template(name: str) -> str:
    """The text of packaging/linux/`name`: inside the installed package (the wheel carries it
    as rbroker_protocol/units), else in the source tree."""
    here = Path(__file__).resolve().parent
    for folder in (here / "units", here.parents[1] / "packaging" / "linux"):
        if (folder / name).is_file():
            return (folder / name).read_text(encoding="utf-8")
    raise InstallError(
        f"the unit {name} is missing from this installation of rbroker: reinstall it from a "
        "wheel built by `uv build` in a clone"
    )
