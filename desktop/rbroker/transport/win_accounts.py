"""Windows accounts of processes and pipes, for the named-pipe transport (Windows only).

- `process_account(pid)`: the user SID and `DOMAIN\\name` of a process, from its token
  (OpenProcess + OpenProcessToken + GetTokenInformation(TokenUser)): how the broker knows
  who is on the other end of a pipe, never from the request;
- `is_elevated_admin(pid)`: whether its token has the Administrators group enabled;
- `own_sid()`: this process's account;
- `owner_sid(handle)`: the owner of a kernel object (a pipe instance), which a process can
  only set to its own account (or with SeRestorePrivilege).
"""

from __future__ import annotations

import sys

if sys.platform == "win32":
    import win32api
    import win32con
    import win32security

    PROCESS_QUERY_LIMITED_INFORMATION = 0x1000

    def process_account(pid: int) -> tuple[str, str]:
        """`(SID string, DOMAIN\\name)` of process `pid`'s user.

        Raises:
            pywintypes.error: the process or its token cannot be opened.
        """
        process = win32api.OpenProcess(PROCESS_QUERY_LIMITED_INFORMATION, False, pid)
        try:
            token = win32security.OpenProcessToken(process, win32con.TOKEN_QUERY)
            try:
                sid, _attrs = win32security.GetTokenInformation(token, win32security.TokenUser)
            finally:
                win32api.CloseHandle(token)
        finally:
            win32api.CloseHandle(process)
        name, domain, _kind = win32security.LookupAccountSid(None, sid)
        return win32security.ConvertSidToStringSid(sid), f"{domain}\\{name}" if domain else name

    ADMINISTRATORS_SID = "S-1-5-32-544"
    SE_GROUP_ENABLED = 0x00000004

    def is_elevated_admin(pid: int) -> bool:
        """True when process `pid`'s token has BUILTIN\\Administrators enabled (UAC gives
        it to elevated processes only); False when the token cannot be read."""
        try:
            process = win32api.OpenProcess(PROCESS_QUERY_LIMITED_INFORMATION, False, pid)
            try:
                token = win32security.OpenProcessToken(process, win32con.TOKEN_QUERY)
                try:
                    groups = win32security.GetTokenInformation(token, win32security.TokenGroups)
                finally:
                    win32api.CloseHandle(token)
            finally:
                win32api.CloseHandle(process)
        except Exception:  # pywintypes.error: not readable, not an administrator here
            return False
        return any(
            win32security.ConvertSidToStringSid(sid) == ADMINISTRATORS_SID
            and attrs & SE_GROUP_ENABLED
            for sid, attrs in groups
        )

    def own_sid() -> str:
        """The SID string of this process's user."""
        return process_account(win32api.GetCurrentProcessId())[0]

    def owner_sid(handle: int) -> str:
        """The owner SID string of kernel object `handle` (needs READ_CONTROL on it).

        Raises:
            pywintypes.error: the security information cannot be read.
        """
        sd = win32security.GetSecurityInfo(
            handle, win32security.SE_KERNEL_OBJECT, win32security.OWNER_SECURITY_INFORMATION
        )
        return win32security.ConvertSidToStringSid(sd.GetSecurityDescriptorOwner())
