"""`rbroker broker install-system` and `rbroker broker uninstall-system`: the Linux system
broker (packaging/linux/rbroker-broker.service) installed and removed in one command each
(`rbroker_protocol.system_install` does the work; docs/operator-guide.md, "Shared Linux GPU
server")."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from rbroker.base.version import __version__
from rbroker_protocol.startup import one_line

ACTIONS = ("install-system", "uninstall-system")
UNIT = "rbroker-broker.service"
ACCOUNT = "rbroker"
RUNTIME_DIR = "/run/rbroker"
STATE_DIR = "/var/lib/rbroker"
EXIT_FAILED = 1
EXIT_USAGE = 2


class _OneLine(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: {one_line(message)} (see {self.prog} --help)\n")


def build_parser(action: str) -> argparse.ArgumentParser:
    prog = f"rbroker broker {action}"
    if action == "install-system":
        p = _OneLine(
            prog=prog,
            description="Install the system broker (Linux, as root): the service account "
            f"{ACCOUNT} (a system user without a login) and the groups given that are "
            f"missing, {RUNTIME_DIR} (0755) and {STATE_DIR} (0750), the unit {UNIT} running "
            "this rbroker, then systemctl enable and (re)start when systemd runs. Run again "
            "it upgrades in place and keeps the leases and the enrollment.",
            epilog="exit codes: 0 done; 1 a step failed (the line names it); 2 bad input, "
            "not root or not Linux (a --dry-run any user may run)",
        )
        who = p.add_mutually_exclusive_group()
        who.add_argument(
            "--allowed-group",
            metavar="GROUP",
            help=f"only its members (and root) may use the broker (default {ACCOUNT}; made "
            "when missing; not a group that gives more, such as sudo, disk or docker)",
        )
        who.add_argument(
            "--everyone",
            action="store_true",
            help="every local user may use the broker (no --allowed-group; socket 0666)",
        )
        p.add_argument(
            "--admin-group",
            metavar="GROUP",
            help="its members may end anyone's lease and pause admissions (made when missing)",
        )
        p.add_argument(
            "--members",
            action="append",
            default=[],
            metavar="PROJECT=NAME,...",
            help="keep a project to these OS users and @groups: writes [members] of a new "
            f"{STATE_DIR}/broker.toml (repeatable)",
        )
    else:
        p = _OneLine(
            prog=prog,
            description=f"Stop, disable and remove the system broker's unit {UNIT}, "
            f"{RUNTIME_DIR}, and the account and groups its install made. {STATE_DIR} (the "
            "leases, the enrollment, broker.toml) is kept unless --purge.",
            epilog="exit codes: 0 done (or nothing installed); 1 a step failed; 2 not root (a "
            "--dry-run any user may run)",
        )
        p.add_argument("--purge", action="store_true", help=f"also remove {STATE_DIR}")
    p.add_argument("--dry-run", action="store_true", help="say what it would do, change nothing")
    if action == "install-system":
        p.add_argument(
            "--exec",
            metavar="PATH",
            help="the installed rbroker program the unit runs (default: this one)",
        )
    p.add_argument(
        "--root",
        type=Path,
        default=Path("/"),
        metavar="DIR",
        help="for packagers (like DESTDIR): the files go under DIR, naming their final paths; "
        "systemd is not told (accounts are still made on this computer)",
    )
    return p


def _members_toml(items: list[str]) -> str:
    lines = ["[members]"]
    for item in items:
        project, _, names = item.partition("=")
        listed = [n.strip() for n in names.split(",") if n.strip()]
        if not project.strip() or not listed:
            raise ValueError(f"wants PROJECT=NAME,..., got {item!r}")
        quoted = ", ".join('"' + n.replace("\\", "\\\\").replace('"', '\\"') + '"' for n in listed)
        key = project.strip()
        if not re.fullmatch(r"[A-Za-z0-9_-]+", key):
            key = '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'
        lines.append(f"{key} = [{quoted}]")
    return "\n".join(lines) + "\n"


def _warn_unknown_members(items: list[str]) -> None:
    """One warning line on stderr for each `--members` name that is no user (`@NAME`: no
    group) of this computer yet: a misspelt name keeps the project from the one it was meant
    for (an account that comes later, from a directory service, is fine)."""
    if sys.platform == "win32":  # `run` refuses there first (no pwd or grp)
        return
    import grp
    import pwd

    for item in items:
        for name in (n.strip() for n in item.partition("=")[2].split(",")):
            group = name.startswith("@")
            try:
                (grp.getgrnam if group else pwd.getpwnam)(name.removeprefix("@"))
            except KeyError:
                kind = "group" if group else "user"
                print(
                    f"rbroker: warning: --members: no {kind} {name.removeprefix('@')} on this "
                    "computer (yet): check the spelling (a user by name, a group as @name)",
                    file=sys.stderr,
                )


def run(argv: list[str]) -> int:
    """`argv`: the action and its options (after `rbroker broker`)."""
    action, rest = argv[0], argv[1:]
    args = build_parser(action).parse_args(rest)
    if sys.platform == "win32":
        print(
            f"rbroker: rbroker broker {action} is for Linux; on Windows the system broker is "
            "the service: rbroker service install",
            file=sys.stderr,
        )
        return EXIT_USAGE
    from rbroker_protocol import system_install as si

    try:
        if action == "uninstall-system":
            si.refuse_unless_root(f"rbroker broker {action}", dry_run=args.dry_run)
            si.uninstall(
                UNIT,
                [STATE_DIR],
                [RUNTIME_DIR],
                root=args.root,
                purge=args.purge,
                dry_run=args.dry_run,
            )
            return 0
        allowed = args.allowed_group or ACCOUNT
        named = [] if args.everyone else [("--allowed-group", allowed)]
        if args.admin_group:
            named.append(("--admin-group", args.admin_group))
        for option, group in named:
            si.check_name(option, group)
        groups = [group for _, group in named]
        if not args.everyone:
            si.check_unprivileged_group("--allowed-group", allowed)
        extra = []
        if args.members:
            try:
                text = _members_toml(args.members)
                import tomllib

                from rbroker.broker.members import Members

                Members(tomllib.loads(text)["members"])
            except ValueError as exc:
                raise si.InstallError(f"--members: {exc}", usage=True) from exc
            extra.append((f"{STATE_DIR}/broker.toml", text))
        program = si.entry_point("rbroker", "rbroker", args.exec)
        si.refuse_unless_root(f"rbroker broker {action}", dry_run=args.dry_run)
        if args.root == Path("/"):
            si.check_runnable(program, ACCOUNT, "rbroker", "rbroker-*.whl")
        exec_start = [*program, "broker", "--system"]
        if not args.everyone:
            exec_start += ["--allowed-group", allowed]
        if args.admin_group:
            exec_start += ["--admin-group", args.admin_group]
        service = si.Service(
            unit=UNIT,
            account=ACCOUNT,
            exec_start=exec_start,
            groups=groups,
            member_of=groups[:1] if not args.everyone else [],
            directories=[
                si.Directory(RUNTIME_DIR, 0o755),
                si.Directory(STATE_DIR, 0o750, state=True),
            ],
        )
        si.install(
            service,
            si.unit_template(UNIT),
            __version__,
            root=args.root,
            dry_run=args.dry_run,
            extra_files=extra,
        )
        _warn_unknown_members(args.members)  # once it is written (or would be)
    except si.InstallError as exc:
        print(f"rbroker: {one_line(str(exc))}", file=sys.stderr)
        return EXIT_USAGE if exc.usage else EXIT_FAILED
    except BrokenPipeError:
        raise  # `| head`: main ends quietly
    except OSError as exc:  # a file it reads (the unit, a directory) that cannot be read
        where = f" ({exc.filename})" if exc.filename else ""
        print(f"rbroker: {action}: {exc.strerror or exc}{where}", file=sys.stderr)
        return EXIT_FAILED
    return 0
