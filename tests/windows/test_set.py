"""The Windows test set (tests/windows/SET) names what exists, every Windows-only test file of
the suite is in it (a Windows-only file left out would run nowhere), and what it leaves out as
platform-neutral (its `# neutral:` lines) is: no process, server or Qt loop started (but the
harness's sleeping lease holders), no Windows module imported, and not also in the set."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import PROCESS_FIXTURES

REPO = Path(__file__).resolve().parents[2]


def _set_lines() -> list[str]:
    return (REPO / "tests" / "windows" / "SET").read_text(encoding="utf-8").splitlines()


def _set_paths() -> list[str]:
    return [p for p in (line.split("#", 1)[0].strip() for line in _set_lines()) if p]


def _neutral_paths() -> list[str]:
    """The paths of the set's `# neutral: PATH  (why)` lines."""
    found = (re.match(r"#\s*neutral:\s*(\S+)", line.strip()) for line in _set_lines())
    return [m.group(1) for m in found if m]


def _files(rel: str) -> list[Path]:
    path = REPO / rel
    return sorted(path.rglob("test_*.py")) if path.is_dir() else [path]


WINDOWS_MODULES = re.compile(
    r"\b(pipe_windows|service_windows|win_acl|win_accounts|machine_lock_windows|wddm"
    r"|nvml_discovery|autostart|keyrings|win32\w*|winreg|msvcrt|_winapi)\b"
)
"""Modules whose code exists for Windows: a test importing one is never platform-neutral."""


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


PROCESS_CALLS = re.compile(
    r"start_broker\(|SimulatedBroker|subprocess|Popen|uvicorn|start_coordinator|run_as\(|QApplication"
)
"""What, in a test file's text, starts a process or a server."""


def process_signs(fixtures: set[str], source: str) -> set[str]:
    """The `PROCESS_FIXTURES` (tests/conftest.py) among `fixtures` and the `PROCESS_CALLS` in
    `source`: empty for a file of the in-process harness or of pure functions. A static look
    at a file's text, for the set's neutral files only: a test's kind mark comes from what it
    uses (`kind_of`) and is checked by what it does (`UnitStartsNothing`)."""
    return (fixtures & PROCESS_FIXTURES) | {m.group(0) for m in PROCESS_CALLS.finditer(source)}


def test_the_neutral_files_start_nothing_import_nothing_of_windows_and_are_left_out() -> None:
    """A `# neutral:` file must be what the set's header says: no process, server, socket or
    Qt loop (`process_signs`: what the file's tests use or its text calls, but the harness's
    sleeping lease holders, `pool`), no Windows module imported, not Windows-only, and not in
    the set as well."""

    neutral = _neutral_paths()
    assert len(neutral) >= 5
    listed = _set_paths()
    signature = re.compile(r"\bdef \w+\(([^)]*)\)", re.S)  # parameters name the fixtures
    wrong: list[str] = []
    for rel in neutral:
        if not (REPO / rel).exists():
            wrong.append(f"{rel}: no such path")
            continue
        if any(rel == p or rel.startswith(p.rstrip("/") + "/") for p in listed):
            wrong.append(f"{rel}: also in the set")
        for path in _files(rel):
            source = path.read_text(encoding="utf-8")
            name = path.relative_to(REPO).as_posix()
            params = {
                p.split(":")[0].strip().lstrip("*")
                for sig in signature.findall(source)
                for p in sig.split(",")
            }
            # the harness's sleeping lease holders (`pool`) are props, not the subject
            if process_signs(params, source) - {"pool"}:
                wrong.append(f"{name}: starts a process, server or Qt loop")
            if WINDOWS_MODULES.search(source) or "win32" in source:
                wrong.append(f"{name}: names Windows code")
    assert wrong == []
