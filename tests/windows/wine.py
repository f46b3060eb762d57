"""Wine, seen from both sides: whether this Windows process runs under Wine, and, on Linux,
how to start the Windows interpreter that `bash .ci/wine setup` installs.

- `UNDER_WINE`: this is a Windows process under Wine (Wine's ntdll exports
  `wine_get_version`; Windows' does not).
- `WINE_READY` / `SKIP_REASON`: on Linux, whether `.ci/wine python` can run (the prefix's
  interpreter and wheels are installed); the cross-platform tests (`test_cross_*.py`) skip
  with `SKIP_REASON` when not.
- `win_python(args, env=…)`: `bash .ci/wine python ARGS…` as a `subprocess.Popen` with text
  output piped (a Windows python under Wine 8 dies when its stdout is a regular Linux file).
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WINE_SCRIPT = REPO / ".ci" / "wine"
WINE_HOME = Path(os.environ.get("RBROKER_WINE_HOME", Path.home() / ".cache" / "rbroker-wine"))


def _under_wine() -> bool:
    if sys.platform != "win32":
        return False
    try:
        ntdll = ctypes.WinDLL("ntdll")  # type: ignore[attr-defined,unused-ignore]
    except OSError:
        return False
    return hasattr(ntdll, "wine_get_version")


UNDER_WINE: bool = _under_wine()

WINE_READY: bool = (
    sys.platform.startswith("linux")
    and (WINE_HOME / "prefix" / "drive_c" / "Python311" / "python.exe").is_file()
    and (WINE_HOME / "stamps" / "wheels").is_file()
)
SKIP_REASON = (
    "pairs a Windows process under Wine with a Linux one, from the Linux side "
    "(run by `bash .ci/wine test`)"
    if sys.platform == "win32"
    else "pairs a Windows process under Wine with a Linux one: needs `bash .ci/wine setup` "
    "(run by `bash .ci/wine test`)"
)


def unix_to_wine(path: Path | str) -> str:
    """The Windows path of a Linux path under Wine (Wine maps `/` to `Z:`)."""
    return "Z:" + str(Path(path).resolve()).replace("/", "\\")


def win_python(
    args: list[str], env: dict[str, str] | None = None, **kw: object
) -> subprocess.Popen[str]:
    """Start `bash .ci/wine python ARGS…`; stdout and stderr together, piped, as text.

    Raises:
        RuntimeError: the Windows interpreter is not set up (`WINE_READY` is false).
    """
    if not WINE_READY:
        raise RuntimeError(SKIP_REASON)
    return subprocess.Popen(  # type: ignore[call-overload,no-any-return]
        ["bash", str(WINE_SCRIPT), "python", *args],
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **kw,
    )
