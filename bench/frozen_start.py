"""The frozen Windows app (`bash .ci/wine freeze`): how fast its command line starts and how
big its folder is.

Measures, on this Linux machine under Wine (`.ci/wine`'s prefix and Windows CPython 3.11):
- the figure: `rbroker.exe --version` of dist/windows/rbroker/ (a new process to its end);
- the floor: the Windows interpreter's `python -c pass`, and beside it `python -m rbroker
  --version` from the checkout (rbroker as a developer runs it), the kinds taking turns;
- the folder's size, and that of its `_internal/` and the Qt part of it.
Each process is started as `.ci/wine` starts one (the 64-bit loader, output through a pipe),
while a sleeping Windows process keeps the prefix's wineserver and its own processes up, so
what is timed is a Windows process's start and run under an already running Wine.

    python bench/frozen_start.py [--quick] [--record] [--repeats 5]
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from _common import REPO, Report, fmt_ms, fmt_x, median, parser

WINE = "/usr/lib/wine/wine64"
FROZEN = REPO / "dist" / "windows" / "rbroker"
WINE_HOME = Path(os.environ.get("RBROKER_WINE_HOME") or Path.home() / ".cache" / "rbroker-wine")
PYTHON = r"C:\Python311\python.exe"


def _env() -> dict[str, str]:
    return {**os.environ, "WINEPREFIX": str(WINE_HOME / "prefix"), "WINEDEBUG": "-all"}


def _timed(argv: list[str]) -> float:
    t0 = time.perf_counter()
    done = subprocess.run(
        [WINE, *argv], env=_env(), stdin=subprocess.DEVNULL, capture_output=True, check=False
    )
    took = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {done.returncode}: {done.stderr[-300:]!r}")
    return took


def _mib(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 2**20


def _measure(exe: Path, repeats: int) -> dict[str, list[float]]:
    """`repeats` timed starts of each kind, the kinds taking turns, after one untimed each."""
    kinds: dict[str, list[str]] = {
        "frozen": [str(exe), "--version"],
        "pass": [PYTHON, "-c", "pass"],
        "module": [PYTHON, "-m", "rbroker", "--version"],
    }
    for argv in kinds.values():  # files in the page cache
        _timed(argv)
    times: dict[str, list[float]] = {k: [] for k in kinds}
    for _ in range(repeats):
        for kind, argv in kinds.items():
            times[kind].append(_timed(argv))
    return times


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5, help="starts of each kind (default 5)")
    args = p.parse_args()
    exe = FROZEN / "rbroker.exe"
    if not exe.is_file():
        raise SystemExit(f"no {exe.relative_to(REPO)}: build it with bash .ci/wine freeze")
    repeats = 2 if args.quick else args.repeats
    report = Report("The frozen Windows app under Wine (bench/frozen_start.py)", args.quick)
    # the prefix's own processes first, their output elsewhere: they outlive the process that
    # starts them, and a pipe they inherit would never close (see winpy in .ci/wine)
    subprocess.run(
        [WINE, "wineboot"],
        env=_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=False,
    )
    keeper = subprocess.Popen(
        [WINE, PYTHON, "-c", "import time; time.sleep(900)"],
        env=_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        times = _measure(exe, repeats)
    finally:
        keeper.kill()
        keeper.wait(30)
        if keeper.stdout is not None:
            keeper.stdout.close()
    frozen, bare, module = (median(times[k]) for k in ("frozen", "pass", "module"))

    report.add(
        f"`rbroker.exe --version`, frozen (median of {repeats})",
        fmt_ms(frozen),
        f"{fmt_ms(bare)} Windows python -c pass",
        fmt_x(frozen / bare),
    )
    report.add(
        f"`python -m rbroker --version` from the checkout (median of {repeats})",
        fmt_ms(module),
        f"{fmt_ms(bare)} Windows python -c pass",
        fmt_x(module / bare),
    )
    report.add("dist/windows/rbroker/, the whole folder", f"{_mib(FROZEN):.0f} MiB")
    report.add("of it: _internal/PySide6 (Qt)", f"{_mib(FROZEN / '_internal' / 'PySide6'):.0f} MiB")
    report.note(
        "Under Wine 8.0 on Linux with the Windows CPython 3.11.9 that bash .ci/wine setup "
        "installs: every figure includes Wine's own process start (about the floor); on "
        "Windows itself they differ"
    )
    report.finish(args.record)


if __name__ == "__main__":
    main()
