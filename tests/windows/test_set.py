"""The Windows test set (tests/windows/SET) names what exists, and every Windows-only test
file of the suite is in it (a Windows-only file left out would run nowhere)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _set_paths() -> list[str]:
    lines = (REPO / "tests" / "windows" / "SET").read_text(encoding="utf-8").splitlines()
    return [p for p in (line.split("#", 1)[0].strip() for line in lines) if p]


def test_every_path_in_the_set_exists() -> None:
    paths = _set_paths()
    assert len(paths) >= 10
    missing = [p for p in paths if not (REPO / p).exists()]
    assert missing == []


def test_every_windows_only_test_file_is_in_the_set() -> None:
    listed = _set_paths()
    windows_only = re.compile(r"skipif\(\s*sys\.platform\s*!=\s*\"win32\"")

    def covered(rel: str) -> bool:
        return any(rel == p or rel.startswith(p.rstrip("/") + "/") for p in listed)

    left_out = [
        path.relative_to(REPO).as_posix()
        for path in sorted((REPO / "tests").rglob("test_*.py"))
        if windows_only.search(path.read_text(encoding="utf-8"))
        and not covered(path.relative_to(REPO).as_posix())
    ]
    assert left_out == []
