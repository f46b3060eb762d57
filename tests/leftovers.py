"""The leftover check: a run fails when its tests leave something behind.

At the start of a run the controller (never an xdist worker) puts a token of its own in the
environment, `RBROKER_TEST_RUN`, which every process the suite starts inherits, and notes the
OS accounts and groups (/etc/passwd, /etc/group), its mounts (/proc/self/mountinfo) and the
listening TCP and Unix sockets (/proc/net). At the end, after the xdist workers are gone, it
looks for processes whose environment carries the token (Wine's own are waited for longer:
wineserver ends a few seconds after its last client), and for accounts, groups, mounts and
listening sockets that were not there at the start. Each one found is a line under "left
behind" naming it (a process with its pid, account, command line and the test it was started
in, from its `PYTEST_CURRENT_TEST`; an account with the test that made it when it was made
through `tests.os_users.create_user`), processes of the run are ended, and the run's exit
status is non-zero. `/proc/PID/environ` is the environment a process was started with: a child
forked without exec (`tests.os_users.run_as`) shows its parent's, which holds the token in an
xdist worker and not in the controller of a `-n 0` run.

What cannot be checked is said in one line, never skipped silently: not Linux (nothing is
checked), not root (processes of other accounts are not looked at), a run inside another run
of the suite (only the inner run's own processes are checked: accounts, mounts and sockets are
the outer run's to check). A process started with an environment built from scratch (`env
-i`) does not carry the token and is not found.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import sys
import tempfile
import time
from collections.abc import Generator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

RUN_ENV = "RBROKER_TEST_RUN"
"""The environment variable holding the run's token (hex), inherited by every process."""

GRACE_S = 5.0
"""How long processes of the run get to end on their own after the last test."""

WINE_GRACE_S = 30.0
"""How long Wine's own processes get: wineserver ends a few seconds after its last client,
and the services it started end before it."""

WINE_OWN = frozenset(
    {
        "wineserver",
        "services.exe",
        "winedevice.exe",
        "explorer.exe",
        "plugplay.exe",
        "svchost.exe",
        "rpcss.exe",
        "conhost.exe",
    }
)
"""Wine's own processes (by the last part of their program's path), as in .ci/wine-test."""

CMDLINE_CHARS = 400
"""How much of a leftover process's command line its line shows."""


def note_account(name: str) -> None:
    """Note that this run made the OS account `name` (and the test making it), so that the
    check names where an account left behind came from. Nothing outside a checked run."""
    path = _accounts_file(os.environ.get(RUN_ENV, ""))
    if path is None:
        return
    test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]
    with open(path, "a", encoding="utf-8") as out:
        out.write(f"{name}\t{test}\n")


def _accounts_file(token: str) -> Path | None:
    """Where the run of `token` notes the accounts it made (None without a token)."""
    if not token.isalnum():
        return None
    return Path(tempfile.gettempdir()) / f"rbroker-test-run-{token}.accounts"


# --- what is looked at ---------------------------------------------------------------------


@dataclass(frozen=True)
class Proc:
    """A process of the run: `test` is where it was started (its PYTEST_CURRENT_TEST)."""

    pid: int
    user: str
    cmdline: str
    test: str

    @property
    def wine_own(self) -> bool:
        program = self.cmdline.split(" ", 1)[0].replace("\\", "/").rsplit("/", 1)[-1].lower()
        return program in WINE_OWN or program.startswith("wineserver")  # also wineserver64

    def line(self) -> str:
        cmd = " ".join(self.cmdline.split())  # one line, whatever the arguments held
        if len(cmd) > CMDLINE_CHARS:
            cmd = cmd[: CMDLINE_CHARS - 1] + "…"
        where = f", started in {self.test}" if self.test else ""
        wine = ", Wine's own" if self.wine_own else ""
        return f"process pid {self.pid} of {self.user}{where}{wine}: {cmd}"


def _user_of(uid: int) -> str:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def processes_of_run(token: str) -> tuple[list[Proc], int]:
    """The processes (other than this one) whose environment holds `RBROKER_TEST_RUN=token`,
    and how many processes' environments could not be read (other accounts', not as root)."""
    mark = f"{RUN_ENV}={token}".encode()
    found: list[Proc] = []
    unreadable = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except PermissionError:
            unreadable += 1
            continue
        except OSError:  # ended meanwhile
            continue
        if mark not in environ:
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            uid = entry.stat().st_uid
        except OSError:
            continue
        test = ""
        for var in environ:
            if var.startswith(b"PYTEST_CURRENT_TEST="):
                test = var.split(b"=", 1)[1].decode(errors="replace")
        found.append(Proc(int(entry.name), _user_of(uid), cmdline.strip(), test))
    return found, unreadable


def _names(path: str) -> set[str]:
    """The names of /etc/passwd or /etc/group (empty where the file cannot be read)."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return set()
    return {line.split(":", 1)[0] for line in text.splitlines() if line and line[0] != "#"}


IPROUTE2_STATE_DIRS = frozenset({"/run/netns", "/var/run/netns"})
"""Mount points that are iproute2's, not a test's: the first `ip netns add` on a computer makes
its state directory a shared bind mount of itself, so that the namespaces mounted under it show
in every mount namespace, and `ip netns del` leaves it by design (iproute2's ip/ipnetns.c,
netns_add). The namespaces themselves, `/run/netns/NAME`, are nsfs mounts and are checked."""


def _mounts() -> dict[str, str]:
    """Mount id → "MOUNT POINT (FSTYPE SOURCE)" of this process's mount namespace, without
    iproute2's state directories (IPROUTE2_STATE_DIRS)."""
    found: dict[str, str] = {}
    try:
        text = Path("/proc/self/mountinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return found
    for line in text.splitlines():
        head, _, tail = line.partition(" - ")
        fields, rest = head.split(), tail.split()
        if len(fields) >= 5 and len(rest) >= 2 and fields[4] not in IPROUTE2_STATE_DIRS:
            found[fields[0]] = f"{fields[4]} ({rest[0]} {rest[1]})"
    return found


def _tcp_address(text: str) -> str:
    """/proc/net/tcp's `HEX_ADDRESS:HEX_PORT` as `address:port`."""
    import ipaddress

    address, port = text.split(":")
    raw = bytes.fromhex(address)
    # the kernel writes each 32-bit word in host (little-endian) order
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    ip = ipaddress.ip_address(words)
    return f"{ip}:{int(port, 16)}" if ip.version == 4 else f"[{ip}]:{int(port, 16)}"


def listening_sockets() -> dict[str, str]:
    """Socket inode → "tcp ADDRESS:PORT" or "unix PATH" of every listening socket of this
    network namespace (abstract Unix names start with @)."""
    found: dict[str, str] = {}
    for name in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/net/{name}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) > 9 and parts[3] == "0A":  # TCP_LISTEN
                found[parts[9]] = f"tcp {_tcp_address(parts[1])}"
    try:
        lines = Path("/proc/net/unix").read_text(errors="replace").splitlines()[1:]
    except OSError:
        lines = []
    for line in lines:
        parts = line.split()
        # Num RefCount Protocol Flags Type St Inode [Path]; __SO_ACCEPTCON is 0x10000
        if len(parts) >= 7 and int(parts[3], 16) & 0x10000:
            found[parts[6]] = f"unix {parts[7] if len(parts) > 7 else '(unnamed)'}"
    return found


def _socket_owners(inodes: set[str]) -> dict[str, set[int]]:
    """Socket inode → the pids holding it open (those whose descriptors can be read)."""
    owners: dict[str, set[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fds = list((entry / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in inodes:
                owners.setdefault(target[8:-1], set()).add(int(entry.name))
    return owners


@dataclass
class Snapshot:
    """What the computer had at the start of the run."""

    accounts: set[str] = field(default_factory=set)
    groups: set[str] = field(default_factory=set)
    mounts: dict[str, str] = field(default_factory=dict)
    sockets: dict[str, str] = field(default_factory=dict)

    @classmethod
    def take(cls) -> Snapshot:
        return cls(_names("/etc/passwd"), _names("/etc/group"), _mounts(), listening_sockets())


# --- the check -----------------------------------------------------------------------------


def wait_for_processes(token: str) -> tuple[list[Proc], int]:
    """The run's processes still there after `GRACE_S` (`WINE_GRACE_S` while all that is left
    is Wine's own), and how many environments could not be read."""
    started = time.monotonic()
    while True:
        procs, unreadable = processes_of_run(token)
        waited = time.monotonic() - started
        limit = WINE_GRACE_S if all(p.wine_own for p in procs) else GRACE_S
        if not procs or waited > limit:
            return procs, unreadable
        time.sleep(0.2)


def _end(procs: list[Proc]) -> None:
    """SIGKILL the processes of the run that were left (never Wine's own: wineserver ends
    them itself once no Windows process of the run is left)."""
    for proc in procs:
        if not proc.wine_own:
            with contextlib.suppress(OSError):
                os.kill(proc.pid, signal.SIGKILL)


class LeftoverCheck:
    """The controller's check: the token and the snapshot at configure, the lines at the end."""

    def __init__(self, nested: bool) -> None:
        self.token = secrets.token_hex(8)
        self.nested = nested
        self.before = Snapshot() if nested else Snapshot.take()
        self.made = _accounts_file(self.token)
        os.environ[RUN_ENV] = self.token

    def accounts_made(self) -> dict[str, str]:
        """Account name → the test that made it, as `note_account` wrote them."""
        made: dict[str, str] = {}
        if self.made is None or not self.made.exists():
            return made
        for line in self.made.read_text(encoding="utf-8").splitlines():
            name, _, test = line.partition("\t")
            made[name] = test
        return made

    def findings(self) -> tuple[list[str], list[str]]:
        """(lines of what was left behind, lines of what could not be checked)."""
        found: list[str] = []
        notes: list[str] = []
        procs, unreadable = wait_for_processes(self.token)
        if unreadable and os.geteuid() != 0:
            notes.append(
                f"not root: the environments of {unreadable} processes of other accounts "
                "were not read, so the run's processes running as another account are not seen"
            )
        ours = {p.pid for p in procs}
        for proc in procs:
            ended = "" if proc.wine_own else " (ended)"
            found.append(proc.line() + ended)
        if self.nested:
            notes.append(
                "inside another run of the suite: accounts, mounts and sockets are that run's "
                "to check"
            )
        else:
            found += self._sockets(ours)
            accounts, others = self._accounts()
            found += accounts
            notes += others
            found += self._mounts()
        _end(procs)
        if self.made is not None:
            self.made.unlink(missing_ok=True)
        return found, notes

    def _sockets(self, ours: set[int]) -> list[str]:
        new = {i: s for i, s in listening_sockets().items() if i not in self.before.sockets}
        owners = _socket_owners(set(new))
        lines = []
        for inode, what in sorted(new.items(), key=lambda x: x[1]):
            held = sorted(owners.get(inode, set()) & ours)
            if held:
                pids = ", ".join(str(p) for p in held)
                lines.append(f"listening socket {what}, held by process {pids} (above)")
        return lines

    def _accounts(self) -> tuple[list[str], list[str]]:
        """(accounts and groups this run made and left, lines about new ones it did not
        make). Only `tests.os_users.create_user` makes accounts in the suite (a test says
        so), and it notes each: a new account it did not note is another run's on this
        computer (several runs at once are usual on a developer's machine), said, not
        counted."""
        made = self.accounts_made()
        lines: list[str] = []
        others: list[str] = []
        for kind, path, before in (
            ("account", "/etc/passwd", self.before.accounts),
            ("group", "/etc/group", self.before.groups),
        ):
            for name in sorted(_names(path) - before):
                maker = made.get(name)
                if maker is None:  # a group a test named after its account: NAME-suffix
                    maker = next((t for a, t in made.items() if name.startswith(f"{a}-")), None)
                if maker is None:
                    others.append(
                        f"{kind} {name} is new since the run started but was not made by it "
                        "(another run on this computer?): not counted"
                    )
                    continue
                origin = f"made in {maker}" if maker else "made by this run"
                undo = "userdel" if kind == "account" else "groupdel"
                lines.append(f"{kind} {name} ({origin}): {undo} {name}")
        return lines, others

    def _mounts(self) -> list[str]:
        now = _mounts()
        return [f"mount {now[m]}" for m in sorted(now, key=int) if m not in self.before.mounts]


def _write(config: pytest.Config, lines: list[str], title: str | None = None) -> None:
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        for line in lines:
            print(f"left behind: {line}" if title else line, file=sys.stderr)
        return
    reporter.ensure_newline()  # not after the progress dots
    if title:
        reporter.write_sep("=", title, red=True)
        for line in lines:
            reporter.write_line(f"LEFT BEHIND {line}", red=True)
    else:
        for line in lines:
            reporter.write_line(line)


class Counted:
    """One thing left behind, as an entry of the terminal reporter's stats (which its last
    line counts, and which plugins read as reports: an object with a `__dict__`)."""

    def __init__(self, line: str) -> None:
        self.line = line


class LeftoverPlugin:
    """Registered in the controller (with -n 0, the one process); `check` is None where
    nothing can be checked, `why_not` then says why."""

    def __init__(self, check: LeftoverCheck | None, why_not: str | None) -> None:
        self.check = check
        self.why_not = why_not

    # the innermost wrapper: what follows `yield` runs after every plain sessionfinish hook
    # (xdist's DSession.pytest_sessionfinish, which ends the workers) and before the terminal
    # reporter's summary, whose last line then counts what was left behind
    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> Generator[None]:
        result = yield
        if self.check is None:
            _write(session.config, [f"leftover check: {self.why_not}"])
            return result
        found, notes = self.check.findings()
        _write(session.config, [f"leftover check: {note}" for note in notes])
        if found:
            title = f"left behind by the tests: {len(found)}"
            _write(session.config, found, title)
            reporter = session.config.pluginmanager.get_plugin("terminalreporter")
            if reporter is not None:
                reporter.stats.setdefault("left behind", []).extend(map(Counted, found))
            if session.exitstatus == pytest.ExitCode.OK:
                session.exitstatus = pytest.ExitCode.TESTS_FAILED
        return result


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):  # an xdist worker: the controller checks
        return
    if not sys.platform.startswith("linux"):
        plugin = LeftoverPlugin(None, f"not checked on {sys.platform} (it reads Linux's /proc)")
    else:
        plugin = LeftoverPlugin(LeftoverCheck(nested=RUN_ENV in os.environ), None)
    config.pluginmanager.register(plugin, "rbroker-leftover-check")
