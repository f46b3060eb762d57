"""The Windows service's data folder secured for real, with pywin32 (Windows only; the rules
themselves: test_windows_data_acl_rules.py, on any OS).

What these show: the owner of a real file is read (GetNamedSecurityInfo) and names this
account, a missing path reads as None; securing a folder with the service's own functions
makes it and its `locks\\`, sets the access lists and then reads them back as protected and
exactly the service's (SY, BA; in `locks\\` Users' add-file and read), its entries left with
only what they inherit; a folder whose owner is another account (System32, TrustedInstaller's)
is refused before anything is set.

Under Wine the first part runs; the read-back and the foreign owner are `wine_gap`s: Wine 8
keeps no access list or owner of a file (it makes them up from the Unix mode and gives every
file the Wine user as owner), so it can show neither. What only real Windows proves beyond
these tests (and no test here does): that another, non-administrator user is in fact denied
reading the database or key and writing `broker.toml`, and may add a file to `locks\\` but
not change another user's there: Windows' access check with a second account.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from rbroker.hosting.win_acl import (
    DATA_DIR_SDDL,
    LOCKS_DIR_SDDL,
    DataFolderNotTrusted,
    Owner,
    secure_service_folder,
)

pytestmark = pytest.mark.skipif(sys.platform != "win32", reason="needs Windows security (pywin32)")

NO_FILE_ACLS = "a file's access list is not stored: Wine makes it up from the Unix mode"


def own_sid() -> str:
    from rbroker.transport.win_accounts import own_sid as sid

    return sid()


Ace = tuple[int, int, int, str]
"""(type, flags without INHERITED_ACE, access mask, SID string) of one entry."""


def aces_of(acl: object) -> list[Ace]:
    import win32security

    out: list[Ace] = []
    for i in range(acl.GetAceCount()):  # type: ignore[attr-defined]
        (kind, flags), mask, sid = acl.GetAce(i)  # type: ignore[attr-defined]
        flags &= ~win32security.INHERITED_ACE
        out.append((kind, flags, mask & 0xFFFFFFFF, win32security.ConvertSidToStringSid(sid)))
    return out


def dacl(path: Path) -> tuple[list[Ace], bool]:
    """The entries of `path`'s access list (inherited ones included) and whether it is
    protected."""
    import win32security

    info = win32security.DACL_SECURITY_INFORMATION
    sd = win32security.GetNamedSecurityInfo(str(path), win32security.SE_FILE_OBJECT, info)
    control, _revision = sd.GetSecurityDescriptorControl()
    return aces_of(sd.GetSecurityDescriptorDacl()), bool(control & win32security.SE_DACL_PROTECTED)


def expected(sddl: str) -> list[Ace]:
    """The entries an SDDL string stands for (aliases such as FA, BU resolved)."""
    import win32security

    sd = win32security.ConvertStringSecurityDescriptorToSecurityDescriptor(
        sddl, win32security.SDDL_REVISION_1
    )
    return aces_of(sd.GetSecurityDescriptorDacl())


def secure(folder: Path, locks: Path | None) -> None:
    from rbroker.hosting.win_acl import read_owner, set_dacl

    secure_service_folder(
        folder, locks, own_sid=own_sid(), read_owner=read_owner, set_dacl=set_dacl
    )


def test_the_owner_of_a_real_file_is_read(tmp_path: Path) -> None:
    from rbroker.hosting.win_acl import read_owner

    (tmp_path / "broker.toml").write_text("[shares]\n")
    owner = read_owner(tmp_path / "broker.toml")
    assert owner is not None and owner.sid.upper() == own_sid().upper()
    assert owner.name  # DOMAIN\name, or the SID where Windows cannot name it
    assert read_owner(tmp_path / "absent.toml") is None
    assert read_owner(tmp_path / "absent" / "broker.toml") is None


def test_the_service_folder_is_made_and_secured_with_pywin32(tmp_path: Path) -> None:
    """Every call the service makes runs (a folder made here is this account's, so it is
    accepted); the effect is read back in the next test."""
    folder = tmp_path / "rbroker"
    folder.mkdir()
    (folder / "broker.toml").write_text("[shares]\n")
    secure(folder, folder / "locks")
    secure(folder, folder / "locks")  # a second start finds it secured and accepts it
    assert (folder / "locks").is_dir()


@pytest.mark.wine_gap(NO_FILE_ACLS)
def test_the_access_lists_read_back_protected_and_exact(tmp_path: Path) -> None:
    from rbroker.hosting.win_acl import read_owner

    folder = tmp_path / "rbroker"
    folder.mkdir()
    (folder / "computer.key").write_text("secret")
    secure(folder, folder / "locks")
    assert dacl(folder) == (expected(DATA_DIR_SDDL), True)
    assert dacl(folder / "locks") == (expected(LOCKS_DIR_SDDL), True)
    # the key keeps nothing of its own: SY and BA full control, inherited from the folder
    assert dacl(folder / "computer.key") == (expected("D:(A;;FA;;;SY)(A;;FA;;;BA)"), False)
    # a lock file a broker writes: full control for SY, BA and its creator, read for Users
    # (the creator: the file's owner, this account or, elevated, Administrators)
    lock = folder / "locks" / "rbroker-broker.json"
    lock.write_text("{}")
    creator = read_owner(lock)
    assert creator is not None
    lock_aces, _ = dacl(lock)
    assert sorted(lock_aces) == sorted(
        expected(f"D:(A;;FA;;;SY)(A;;FA;;;BA)(A;;FR;;;BU)(A;;FA;;;{creator.sid})")
    )


@pytest.mark.wine_gap("every file's owner is the Wine user: no file has another account's")
def test_a_folder_owned_by_another_account_is_refused_untouched() -> None:
    """System32 belongs to TrustedInstaller: the service would refuse it as its data folder,
    naming that owner, before setting anything."""
    from rbroker.hosting.win_acl import read_owner

    system32 = Path(os.environ.get("SYSTEMROOT", "C:\\Windows")) / "System32"
    owner = read_owner(system32)
    assert owner is not None
    set_calls: list[Path] = []
    with pytest.raises(DataFolderNotTrusted) as refused:
        secure_service_folder(
            system32,
            None,
            own_sid=own_sid(),
            read_owner=read_owner,
            set_dacl=lambda path, _sddl: set_calls.append(path),
        )
    assert set_calls == []
    assert str(system32) in str(refused.value) and owner.sid in str(refused.value)
    assert Owner(owner.sid, owner.name) == owner
