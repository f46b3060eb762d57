"""Members per project (opt-in, `[members]` in the broker's config file): a project with a
members list may be declared only by its members, so its share (`rbroker.broker.shares`)
belongs to them.

A request that declares a project (`lease.acquire`, `job.declare`) is checked once, inside
the broker (`Broker.begin_acquire`, `Broker.declare_job`), against the caller's OS user as
the local API read it from the OS (peer credentials on Unix, the pipe client's token on
Windows), never a name from the request. It passes when the project has no members list
(every project is open by default), when the user is listed, when the user is in a listed
`@group` (POSIX: the group database at each request, primary and supplementary groups, so
a change takes effect at the next request), or when the caller is an administrator (the
broker's own user, root, `--admin-group`; the local API decides, as for ending another
user's lease). Else it is refused, `not_a_member`, with one line naming the project, the
user and how to be added.

Names: on POSIX a user name matches exactly. On Windows the caller is `DOMAIN\\name`: an
entry `name` matches the account name in any domain and `DOMAIN\\name` only that one, both
without regard to case, as Windows compares account names; `@group` entries are refused
there (Windows groups are not read: the config error says so).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence

from rbroker_protocol.errors import ErrorCode, RpcError

GROUP_PREFIX = "@"
"""An entry `@name` stands for the members of the OS group `name` (POSIX only)."""


class Members:
    """Members lists per project (`{project: ["alice", "@ml-team", ...]}`).

    `windows`: match names as Windows does (see the module docstring); default: this OS.
    `in_group(user, group)`: whether OS user `user` is in OS group `group` (default: the
    POSIX group database, `user_in_group`).
    """

    def __init__(
        self,
        table: Mapping[str, Sequence[str]] | None = None,
        *,
        windows: bool | None = None,
        in_group: Callable[[str, str], bool] | None = None,
    ) -> None:
        """Raises:
        ValueError: one line naming the problem: an empty project name, a list that is
            not a non-empty list of strings, an empty or blank name, `@` alone, a `*`
            project, or an `@group` entry on Windows.
        """
        self.windows = sys.platform == "win32" if windows is None else windows
        self.in_group = in_group or user_in_group
        self.users: dict[str, frozenset[str]] = {}
        self.groups: dict[str, tuple[str, ...]] = {}
        for project, names in (table or {}).items():
            self._add(project, names)

    def _add(self, project: str, names: object) -> None:
        where = f"[members]: {project!r}"
        if not project.strip():
            raise ValueError("[members]: a project name is empty")
        if project == "*":
            raise ValueError(
                "[members]: '*' is not a project: a members list belongs to one named project"
            )
        if not isinstance(names, list | tuple) or not names:
            raise ValueError(
                f'{where} must be a list of OS user names and "@group"s, '
                f'e.g. {project} = ["alice", "@ml-team"]'
            )
        users: set[str] = set()
        groups: list[str] = []
        for name in names:
            if not isinstance(name, str):
                raise ValueError(f"{where}: {name!r} is not a name in quotes")
            if name != name.strip() or not name:
                raise ValueError(f"{where}: {name!r} has spaces around it or is empty")
            if name.startswith(GROUP_PREFIX):
                group = name[len(GROUP_PREFIX) :]
                if not group.strip():
                    raise ValueError(f"{where}: {name!r} names no group")
                if self.windows:
                    raise ValueError(
                        f"{where}: {name!r}: groups are read on Linux only; on Windows list "
                        "each account name (name or DOMAIN\\name)"
                    )
                groups.append(group)
            else:
                users.add(name.casefold() if self.windows else name)
        self.users[project] = frozenset(users)
        self.groups[project] = tuple(groups)

    @property
    def enabled(self) -> bool:
        """Whether any project has a members list."""
        return bool(self.users)

    def projects(self) -> list[str]:
        """The projects with a members list, by name."""
        return sorted(self.users)

    def is_member(self, project: str, user: str) -> bool:
        """Whether OS user `user` may declare `project` (True for a project without a
        members list). On Windows `user` is `DOMAIN\\name` (or `name`)."""
        users = self.users.get(project)
        if users is None:
            return True
        if self.windows:
            full = user.casefold()
            return full in users or full.rpartition("\\")[2] in users
        if user in users:
            return True
        return any(self.in_group(user, group) for group in self.groups[project])

    def check(self, project: str, user: str, admin: bool | Callable[[], bool] = False) -> None:
        """Refuse `user` declaring `project` unless a member or `admin` (a flag, or a
        function asked only when the user is no member).

        Raises:
            RpcError: `not_a_member` with `project` and `user`.
        """
        if project not in self.users or self.is_member(project, user):
            return
        if admin if isinstance(admin, bool) else admin():
            return
        raise RpcError(
            ErrorCode.NOT_A_MEMBER,
            f"project {project!r} is open only to its members on this broker, and user "
            f"{user} is not one: ask the broker's operator to add you to [members] "
            f"{project} in its config file (broker.toml), or use another project",
            project=project,
            user=user,
        )

    def unknown(self) -> list[str]:
        """One line per user or group named in a list that this computer does not know
        (POSIX; [] on Windows): logged as a warning when the broker starts, never refused,
        since a directory service (LDAP, SSSD) may be out of reach at boot and an unknown
        name only ever keeps someone out."""
        if sys.platform == "win32":
            return []
        if self.windows:
            return []
        import grp
        import pwd

        lines = []
        for project in self.projects():
            for user in sorted(self.users[project]):
                try:
                    pwd.getpwnam(user)
                except KeyError:
                    lines.append(f"[members] {project}: no OS user named {user!r}")
            for group in self.groups[project]:
                try:
                    grp.getgrnam(group)
                except KeyError:
                    lines.append(f"[members] {project}: no OS group named {group!r}")
        return lines


def user_in_group(user: str, group: str) -> bool:
    """True when OS user `user` is a member of OS group `group` (primary or supplementary,
    from the group database now); unknown users or groups are not members; False on
    Windows. The one group lookup of the broker: `[members]` here, and the local API's
    `--admin-group` and `--allowed-group` (`rbroker.localapi.access`)."""
    if sys.platform == "win32":
        return False
    import grp
    import pwd

    try:
        gid = grp.getgrnam(group).gr_gid
        entry = pwd.getpwnam(user)
    except KeyError:
        return False
    return gid in os.getgrouplist(user, entry.pw_gid)
