"""`bash .ci/release`: the wheel and the source package of the last commit with their
SHA-256 sums, the same bytes when built again (the commit's time for every file), and a wheel
that `uv tool install` installs as a user would, its `rbroker` starting.

About 15 s, mostly waiting on uv (two builds of the commit, one tool install): cheap enough to
run with the rest rather than only when releasing, and what it proves (a wheel that installs
and starts, the same bytes for the same commit) is what each change could break.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
WHEEL = f"rbroker-{VERSION}-py3-none-any.whl"
SDIST = f"rbroker-{VERSION}.tar.gz"

pytestmark = [pytest.mark.contract, pytest.mark.slow]


def _env() -> dict[str, str]:
    """The environment without this virtualenv's; the Windows half (a frozen build under
    Wine, minutes) left out: tests/windows/test_frozen_windows.py tests what it is made of."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["RBROKER_RELEASE_WINDOWS"] = "no"
    return env


def _index_reachable(host: str = "pypi.org", timeout_s: float = 3.0) -> bool:
    try:
        with socket.create_connection((host, 443), timeout=timeout_s):
            return True
    except OSError:
        return False


def _release(out: Path) -> str:
    if shutil.which("uv") is None:
        pytest.skip("uv is not on PATH (.ci/release builds with uv)")
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: .ci/release builds the last commit")
    done = subprocess.run(
        ["bash", str(ROOT / ".ci" / "release"), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env=_env(),
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def released(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    said = _release(out)
    assert "the Windows artifacts left out" in said  # the hook says what it did not build
    return out


def test_release_sums_what_it_built_and_builds_the_same_bytes_again(
    released: Path, tmp_path: Path
) -> None:
    sums = (released / "SHA256SUMS").read_text().splitlines()
    named = {line.split("  ", 1)[1]: line.split("  ", 1)[0] for line in sums}
    assert set(named) == {WHEEL, SDIST}, sums
    for name, digest in named.items():
        assert hashlib.sha256((released / name).read_bytes()).hexdigest() == digest, name
    _release(tmp_path)
    assert (tmp_path / WHEEL).read_bytes() == (released / WHEEL).read_bytes()
    assert (tmp_path / SDIST).read_bytes() == (released / SDIST).read_bytes()


def test_the_wheel_installs_as_a_tool_and_starts(released: Path, tmp_path: Path) -> None:
    env = {
        **_env(),
        "UV_TOOL_DIR": str(tmp_path / "tools"),
        "UV_TOOL_BIN_DIR": str(tmp_path / "bin"),
    }
    done = subprocess.run(
        ["uv", "tool", "install", "--quiet", str(released / WHEEL)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    if done.returncode != 0:
        assert not _index_reachable(), done.stderr
        # no index reachable: uv's cache, as tests/test_wheel_install.py does
        done = subprocess.run(
            ["uv", "tool", "install", "--offline", "--quiet", str(released / WHEEL)],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
            cwd=tmp_path,
            check=False,
        )
        if done.returncode != 0:
            pytest.skip("no package index reachable and uv's cache lacks the dependencies")
    rbroker = tmp_path / "bin" / "rbroker"
    for argv, expect in (
        (["--version"], f"rbroker {VERSION}"),
        (["--help"], "usage: rbroker"),
        (["broker", "install-system", "--help"], "usage: rbroker broker install-system"),
    ):
        out = subprocess.run(
            [str(rbroker), *argv], capture_output=True, text=True, timeout=60, env=_env()
        )
        assert out.returncode == 0 and expect in out.stdout, (argv, out.stdout, out.stderr)
