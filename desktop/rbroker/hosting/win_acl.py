"""Who may read and change the Windows service's data folder (architecture.md §5).

The service (LocalSystem) keeps its lease database, journal, `broker.toml` ([shares],
[members]), enrollment and key file in `%ProgramData%\\rbroker`. What a folder there gets by
default is inherited from `C:\\ProgramData`: every user (BUILTIN\\Users) may read all of it
and create files and folders in it, so any user could read the key and the database, or make
`broker.toml` (or the whole folder) before the service starts and write its [shares] and
[members]. Python's file modes (0o600) mean nothing there.

So the service, and `rbroker service install`, secure the folder before using it
(`secure_service_folder`):

1. a folder or entry that exists already must be owned by LocalSystem (`S-1-5-18`),
   BUILTIN\\Administrators (`S-1-5-32-544`) or the account this process runs as (LocalSystem
   for the service; the administrator for `service install` or `service run`): any other
   owner could change its access list at any time, so the service refuses to start, in one
   line naming the path, its owner and what to do (`DataFolderNotTrusted`);
2. the folder gets a protected access list (`DATA_DIR_SDDL`: nothing inherited from
   ProgramData): LocalSystem and Administrators full control, to the folder and everything
   in it; nobody else anything;
3. every entry already in it gets only what it inherits from the folder (entries keep no
   access list of their own, whoever gave them one);
4. its `locks\\` (when the folder is the default one, where every broker of this computer
   writes who holds the machine lock: `machine_lock_windows`) gets `LOCKS_DIR_SDDL`: what
   the folder has, and for every user only what writing one's own identity file and reading
   the others' takes (see `LOCKS_DIR_SDDL`).

Not needed for the per-user broker's data dir (the tray's or `rbroker broker`'s, under
`%LOCALAPPDATA%`): that folder inherits the user profile's access list (the user,
LocalSystem and Administrators), which no other user can read or write, and it is made by
its own user, so nothing here applies to it.

The decisions (`owner_allowed`, `refusal`, the SDDL strings, the order of the steps in
`secure_service_folder`, whose reading and writing of security information are parameters)
run on any OS; `read_owner` and `set_dacl`, with pywin32, on Windows only.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

LOCAL_SYSTEM_SID = "S-1-5-18"
ADMINISTRATORS_SID = "S-1-5-32-544"

# Access rights of a folder (winnt.h), for `LOCKS_DIR_SDDL`.
FILE_LIST_DIRECTORY = 0x0001
FILE_ADD_FILE = 0x0002
FILE_READ_EA = 0x0008
FILE_TRAVERSE = 0x0020
FILE_READ_ATTRIBUTES = 0x0080
READ_CONTROL = 0x00020000
SYNCHRONIZE = 0x00100000
FILE_GENERIC_READ = 0x00120089
"""Read a file's data, attributes and access list (what a user's broker needs of another
broker's identity file, to name its holder)."""

LOCKS_DIR_USER_RIGHTS = (
    FILE_LIST_DIRECTORY
    | FILE_ADD_FILE
    | FILE_READ_EA
    | FILE_TRAVERSE
    | FILE_READ_ATTRIBUTES
    | READ_CONTROL
    | SYNCHRONIZE
)
"""What every user may do with `locks\\` itself (0x1200AB): list it and create files in it;
never create folders (FILE_ADD_SUBDIRECTORY), delete others' files (FILE_DELETE_CHILD) or
change the folder."""

DATA_DIR_SDDL = "D:P(A;OICI;FA;;;SY)(A;OICI;FA;;;BA)"
"""The service's data folder: protected (nothing inherited from ProgramData); LocalSystem
and Administrators full control of it and of everything in it (object + container
inherit); nobody else anything."""

LOCKS_DIR_SDDL = (
    "D:P(A;OICI;FA;;;SY)(A;OICI;FA;;;BA)"
    f"(A;;0x{LOCKS_DIR_USER_RIGHTS:08x};;;BU)"
    f"(A;OIIO;0x{FILE_GENERIC_READ:08x};;;BU)"
    "(A;OIIO;FA;;;CO)"
)
"""`locks\\`: every user's broker writes `<lock name>.json` there (who holds the machine
lock) while it holds the `Global\\` mutex, and removes it when it lets go; a second broker
reads it for its message. So Users may create files in the folder (not folders), and read
every file in it; the creator of a file (CREATOR OWNER, inherited by files only) may change
and delete that file, nobody else's. LocalSystem and Administrators: full control."""


@dataclass(frozen=True, slots=True)
class Owner:
    """The owner of a file or folder: its SID string and, where Windows can name it,
    `DOMAIN\\name` (else the SID again)."""

    sid: str
    name: str


class DataFolderNotTrusted(Exception):
    """A path of the service's data folder is owned by an account that must not control it;
    the message is one line naming the path, its owner and what to do."""


def owner_allowed(owner_sid: str, own_sid: str) -> bool:
    """True for LocalSystem, BUILTIN\\Administrators and `own_sid` (the account of this
    process), compared without regard to case."""
    return owner_sid.upper() in {LOCAL_SYSTEM_SID, ADMINISTRATORS_SID, own_sid.upper()}


def refusal(path: Path, owner: Owner, folder: Path) -> str:
    """The one line for `path` (in or being the data `folder`) owned by `owner`."""
    who = owner.sid if owner.name == owner.sid else f"{owner.name} ({owner.sid})"
    return (
        f"{path} is owned by {who}, not by LocalSystem or Administrators: another account "
        f"could change its access list, so the rbroker service does not use {folder}; an "
        f'administrator removes it (rmdir /s /q "{folder}") or takes it over '
        f'(takeown /f "{folder}" /a /r /d y), then starts the service again'
    )


def check_owner(path: Path, owner: Owner | None, own_sid: str, folder: Path) -> None:
    """Refuse `path` whose `owner` (None: the path does not exist) is not allowed.

    Raises:
        DataFolderNotTrusted: `refusal(path, owner, folder)`.
    """
    if owner is not None and not owner_allowed(owner.sid, own_sid):
        raise DataFolderNotTrusted(refusal(path, owner, folder))


ReadOwner = Callable[[Path], "Owner | None"]
"""The owner of a path, None when the path does not exist."""
SetDacl = Callable[[Path, "str | None"], None]
"""Give a path the access list of an SDDL string (protected), or with None drop its own
entries and keep what it inherits."""


def secure_service_folder(
    folder: Path,
    locks: Path | None,
    *,
    own_sid: str,
    read_owner: ReadOwner,
    set_dacl: SetDacl,
) -> None:
    """Check and secure the service's data `folder` (and `locks`, its `locks\\` subfolder
    when the folder is the default one; None otherwise), making them where missing: the
    steps of the module docstring, in that order, so that nobody but LocalSystem and
    Administrators can add an entry between the check of the folder and that of its
    entries.

    Raises:
        DataFolderNotTrusted: the folder, `locks` or an entry of the folder has an owner
            `owner_allowed` refuses (the folder's access list may be set already).
        OSError, pywintypes.error: the folder cannot be made or its security set.
    """
    check_owner(folder, read_owner(folder), own_sid, folder)
    folder.mkdir(parents=True, exist_ok=True)
    set_dacl(folder, DATA_DIR_SDDL)
    entries = sorted(folder.iterdir())
    for entry in entries:
        check_owner(entry, read_owner(entry), own_sid, folder)
    for entry in entries:
        if entry != locks:
            set_dacl(entry, None)
    if locks is not None:
        locks.mkdir(exist_ok=True)
        set_dacl(locks, LOCKS_DIR_SDDL)


if sys.platform == "win32":
    import pywintypes
    import win32security

    ERROR_FILE_NOT_FOUND = 2
    ERROR_PATH_NOT_FOUND = 3

    def read_owner(path: Path) -> Owner | None:
        """The owner of `path` (GetNamedSecurityInfo), None when it does not exist.

        Raises:
            pywintypes.error: another failure, e.g. no READ_CONTROL on it.
        """
        try:
            sd = win32security.GetNamedSecurityInfo(
                str(path), win32security.SE_FILE_OBJECT, win32security.OWNER_SECURITY_INFORMATION
            )
        except pywintypes.error as exc:
            if exc.winerror in (ERROR_FILE_NOT_FOUND, ERROR_PATH_NOT_FOUND):
                return None
            raise
        sid = sd.GetSecurityDescriptorOwner()
        text = win32security.ConvertSidToStringSid(sid)
        try:
            name, domain, _kind = win32security.LookupAccountSid(None, sid)
        except pywintypes.error:  # an account this computer cannot name: the SID says it
            return Owner(text, text)
        return Owner(text, f"{domain}\\{name}" if domain else name)

    def set_dacl(path: Path, sddl: str | None) -> None:
        """Give `path` the protected access list of `sddl` (SetNamedSecurityInfo with
        PROTECTED_DACL_SECURITY_INFORMATION; Windows passes its inheritable entries on to
        what is inside), or with None an empty list of its own, unprotected: only what it
        inherits.

        Raises:
            pywintypes.error: e.g. no WRITE_DAC on it.
        """
        if sddl is None:
            dacl = win32security.ACL()
            flags = win32security.UNPROTECTED_DACL_SECURITY_INFORMATION
        else:
            sd = win32security.ConvertStringSecurityDescriptorToSecurityDescriptor(
                sddl, win32security.SDDL_REVISION_1
            )
            dacl = sd.GetSecurityDescriptorDacl()
            flags = win32security.PROTECTED_DACL_SECURITY_INFORMATION
        win32security.SetNamedSecurityInfo(
            str(path),
            win32security.SE_FILE_OBJECT,
            win32security.DACL_SECURITY_INFORMATION | flags,
            None,
            None,
            dacl,
            None,
        )
