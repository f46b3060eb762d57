"""Who may read and change the Windows service's data folder, tested on any OS: which owners
the service accepts, its one-line refusal, the access lists (SDDL) of the folder and of its
`locks\\`, and the order in which `secure_service_folder` checks and secures a real folder
(security read and written through recording stand-ins here; with pywin32 in
test_windows_data_acl.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rbroker.hosting.service_windows import service_data_dir, service_locks_dir
from rbroker.hosting.win_acl import (
    ADMINISTRATORS_SID,
    DATA_DIR_SDDL,
    LOCAL_SYSTEM_SID,
    LOCKS_DIR_SDDL,
    LOCKS_DIR_USER_RIGHTS,
    DataFolderNotTrusted,
    Owner,
    owner_allowed,
    refusal,
    secure_service_folder,
)

ADMIN = "S-1-5-21-3623811015-3361044348-30300820-500"
MALLORY = Owner("S-1-5-21-3623811015-3361044348-30300820-1013", "PC\\mallory")
FILE_ADD_SUBDIRECTORY = 0x0004
FILE_WRITE_EA = 0x0010
FILE_DELETE_CHILD = 0x0040
FILE_WRITE_ATTRIBUTES = 0x0100
DELETE = 0x00010000
WRITE_DAC = 0x00040000
WRITE_OWNER = 0x00080000


def test_owners_the_service_accepts() -> None:
    assert owner_allowed(LOCAL_SYSTEM_SID, LOCAL_SYSTEM_SID)
    assert owner_allowed(ADMINISTRATORS_SID, LOCAL_SYSTEM_SID)
    assert owner_allowed(ADMIN, ADMIN)  # `rbroker service run` in an administrator's console
    assert owner_allowed(ADMIN.lower(), ADMIN)
    assert not owner_allowed(MALLORY.sid, LOCAL_SYSTEM_SID)
    assert not owner_allowed("S-1-5-32-545", LOCAL_SYSTEM_SID)  # BUILTIN\Users
    assert not owner_allowed("S-1-1-0", LOCAL_SYSTEM_SID)  # Everyone


def test_refusal_is_one_line_naming_path_owner_and_what_to_do() -> None:
    folder = Path("C:\\ProgramData\\rbroker")
    line = refusal(folder / "broker.toml", MALLORY, folder)
    assert "\n" not in line
    assert str(folder / "broker.toml") in line
    assert f"PC\\mallory ({MALLORY.sid})" in line
    assert "takeown" in line and "rmdir" in line and "administrator" in line
    unnamed = refusal(folder, Owner(MALLORY.sid, MALLORY.sid), folder)
    assert f"owned by {MALLORY.sid}, not" in unnamed


def test_the_data_folder_is_for_system_and_administrators_alone() -> None:
    assert DATA_DIR_SDDL == "D:P(A;OICI;FA;;;SY)(A;OICI;FA;;;BA)"


def test_users_may_add_lock_files_and_read_them_nothing_more() -> None:
    assert LOCKS_DIR_SDDL == (
        "D:P(A;OICI;FA;;;SY)(A;OICI;FA;;;BA)(A;;0x001200ab;;;BU)"
        "(A;OIIO;0x00120089;;;BU)(A;OIIO;FA;;;CO)"
    )
    for right in (
        FILE_ADD_SUBDIRECTORY,
        FILE_WRITE_EA,
        FILE_DELETE_CHILD,
        FILE_WRITE_ATTRIBUTES,
        DELETE,
        WRITE_DAC,
        WRITE_OWNER,
    ):
        assert not LOCKS_DIR_USER_RIGHTS & right, hex(right)


def test_locks_are_secured_in_the_default_folder_only() -> None:
    env = {"ProgramData": "D:\\Data"}
    default = service_data_dir(env)
    assert service_locks_dir(default, env) == default / "locks"
    assert service_locks_dir(Path("E:\\rb"), env) is None


class Security:
    """Stand-ins for reading owners and writing access lists: owners by path (the rest is
    owned by this process's account once it exists), and every access list set, in order."""

    def __init__(self, own_sid: str, owners: dict[Path, Owner] | None = None) -> None:
        self.own = Owner(own_sid, "NT AUTHORITY\\SYSTEM")
        self.owners = owners or {}
        self.set: list[tuple[Path, str | None]] = []

    def read_owner(self, path: Path) -> Owner | None:
        if not path.exists():
            return None
        return self.owners.get(path, self.own)

    def set_dacl(self, path: Path, sddl: str | None) -> None:
        assert path.exists(), path
        self.set.append((path, sddl))


def secure(folder: Path, locks: Path | None, sec: Security) -> None:
    secure_service_folder(
        folder, locks, own_sid=sec.own.sid, read_owner=sec.read_owner, set_dacl=sec.set_dacl
    )


def test_a_new_folder_is_made_and_secured(tmp_path: Path) -> None:
    folder = tmp_path / "rbroker"
    sec = Security(LOCAL_SYSTEM_SID)
    secure(folder, folder / "locks", sec)
    assert (folder / "locks").is_dir()
    assert sec.set == [(folder, DATA_DIR_SDDL), (folder / "locks", LOCKS_DIR_SDDL)]


def test_another_data_dir_gets_no_locks_folder(tmp_path: Path) -> None:
    sec = Security(LOCAL_SYSTEM_SID)
    secure(tmp_path / "rb", None, sec)
    assert not (tmp_path / "rb" / "locks").exists()
    assert sec.set == [(tmp_path / "rb", DATA_DIR_SDDL)]


def test_entries_keep_only_what_they_inherit(tmp_path: Path) -> None:
    folder = tmp_path / "rbroker"
    (folder / "locks").mkdir(parents=True)
    for name in ("broker.toml", "computer.key", "leases.db"):
        (folder / name).write_text("x")
    sec = Security(LOCAL_SYSTEM_SID, {folder / "broker.toml": Owner(ADMINISTRATORS_SID, "BA")})
    secure(folder, folder / "locks", sec)
    assert sec.set == [
        (folder, DATA_DIR_SDDL),
        (folder / "broker.toml", None),
        (folder / "computer.key", None),
        (folder / "leases.db", None),
        (folder / "locks", LOCKS_DIR_SDDL),
    ]


def test_a_folder_a_user_made_is_refused_untouched(tmp_path: Path) -> None:
    folder = tmp_path / "rbroker"
    folder.mkdir()
    (folder / "broker.toml").write_text("[shares]\nmallory = 1000\n")
    sec = Security(LOCAL_SYSTEM_SID, {folder: MALLORY})
    with pytest.raises(DataFolderNotTrusted) as refused:
        secure(folder, folder / "locks", sec)
    assert str(refused.value) == refusal(folder, MALLORY, folder)
    assert sec.set == [] and not (folder / "locks").exists()


@pytest.mark.parametrize("name", ["broker.toml", "computer.key", "locks", "leases.db"])
def test_an_entry_a_user_owns_is_refused_after_the_folder_is_closed(
    tmp_path: Path, name: str
) -> None:
    """The folder's access list is set before its entries are checked, so that no user can
    add one between the check and the start; the refused entry keeps its own list."""
    folder = tmp_path / "rbroker"
    folder.mkdir()
    (folder / name).mkdir() if name == "locks" else (folder / name).write_text("x")
    sec = Security(LOCAL_SYSTEM_SID, {folder / name: MALLORY})
    with pytest.raises(DataFolderNotTrusted) as refused:
        secure(folder, folder / "locks", sec)
    assert str(refused.value) == refusal(folder / name, MALLORY, folder)
    assert sec.set == [(folder, DATA_DIR_SDDL)]
