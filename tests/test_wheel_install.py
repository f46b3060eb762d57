"""The operator guide's install path, for real: build the wheel with `uv build`, install it into a
fresh virtual environment (`python -m venv` + pip), and run the installed commands. The
base install without the `[server]` extra goes into a venv made by uv (faster; pip's install
of the wheel is what the `[server]` venv proves).

rbroker is not on a package index, so the deploy sections install `dist/rbroker-<ver>-py3-
none-any.whl[server]`. This proves that wheel installs with its dependencies, that its
console scripts start, and that it carries what the installed code looks for next to itself:
the tray icons, the coordinator's Alembic migrations (run here by `rbroker-server setup`) and
every other non-Python file of the packages (templates, static files).

Dependencies come from the package index when it is reachable (as in CI); without a network
they come from uv's local cache (`uv pip install --offline`), and the test skips, saying
why, only when neither can provide them.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
WHEEL_NAME = f"rbroker-{VERSION}-py3-none-any.whl"

pytestmark = [pytest.mark.contract, pytest.mark.slow]

# package source dir -> where its files land in the wheel
PACKAGES = {
    ROOT / "shared" / "rbroker_protocol": "rbroker_protocol",
    ROOT / "desktop" / "rbroker": "rbroker",
    ROOT / "server" / "rbroker_server": "rbroker_server",
}


def _index_reachable(host: str = "pypi.org", timeout_s: float = 3.0) -> bool:
    try:
        with socket.create_connection((host, 443), timeout=timeout_s):
            return True
    except OSError:
        return False


def _run(cmd: list[str], cwd: Path, timeout_s: float = 600, **kw: object) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    proc = subprocess.run(
        cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s, check=False
    )
    assert proc.returncode == 0, (
        f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    )
    return proc.stdout


@pytest.fixture(scope="module")
def built_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    uv = shutil.which("uv")
    if uv is None:
        pytest.skip("uv is not on PATH (the operator guide builds the wheel with `uv build`)")
    out = tmp_path_factory.mktemp("dist")
    _run([uv, "build", "--wheel", "--out-dir", str(out), str(ROOT)], cwd=out)
    wheel = out / WHEEL_NAME
    assert wheel.is_file(), f"uv build made {sorted(p.name for p in out.iterdir())}"
    return wheel


def _install(requirement: str, home: Path, pip: bool = True) -> Path:
    """A fresh venv under `home` with `requirement` installed; its scripts directory.

    `pip=False`: `uv venv` + `uv pip install` (several times faster), for a venv whose
    test is about the installed code, not about pip installing the wheel."""
    env_dir = home / "venv"
    uv = shutil.which("uv")
    if not pip and uv is not None:
        _run([uv, "venv", "--quiet", "--python", sys.executable, str(env_dir)], cwd=home)
    else:
        _run([sys.executable, "-m", "venv", str(env_dir)], cwd=home)
    bindir = env_dir / ("Scripts" if sys.platform == "win32" else "bin")
    python = bindir / "python"
    online = _index_reachable()
    if pip and online:
        _run([str(python), "-m", "pip", "install", "--quiet", requirement], cwd=home)
        return bindir
    uv = shutil.which("uv")
    assert uv is not None
    offline = [] if online else ["--offline"]
    proc = subprocess.run(
        [uv, "pip", "install", *offline, "--python", str(python), requirement],
        cwd=home,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if proc.returncode != 0:
        assert not online, f"uv pip install {requirement} failed:\n{proc.stderr}"
        pytest.skip(
            "no package index reachable and uv's cache lacks the dependencies: "
            + proc.stderr.strip().splitlines()[-1]
        )
    return bindir


@pytest.fixture(scope="module")
def venv(built_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with `<wheel>[server]` installed, as the deploy sections do it."""
    return _install(f"{built_wheel}[server]", tmp_path_factory.mktemp("venv"))


@pytest.fixture(scope="module")
def base_venv(built_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the base wheel only (no extra), as a GPU computer installs it.

    Installed by uv: pip installing this wheel is what `venv` (the operator guide's own command,
    with the extra) proves; this one is about what the base install does without it."""
    return _install(str(built_wheel), tmp_path_factory.mktemp("base-venv"), pip=False)


def test_wheel_carries_icons_migrations_and_package_data(built_wheel: Path) -> None:
    names = set(zipfile.ZipFile(built_wheel).namelist())
    icons = sorted(p.name for p in (ROOT / "assets").iterdir() if p.is_file())
    assert "tray-idle.svg" in icons and "rbroker.png" in icons
    for icon in icons:
        assert f"rbroker/tray/assets/{icon}" in names, f"icon {icon} missing from the wheel"
    migrations = ROOT / "server" / "rbroker_server" / "db" / "migrations"
    revisions = sorted(p.name for p in (migrations / "versions").glob("*.py"))
    assert revisions, "no migration revisions in the source tree"
    for name in ["env.py", "script.py.mako", *(f"versions/{r}" for r in revisions)]:
        assert f"rbroker_server/db/migrations/{name}" in names, f"migration {name} missing"
    for unit in sorted((ROOT / "packaging" / "linux").glob("*.service")):
        assert f"rbroker_protocol/units/{unit.name}" in names, f"unit {unit.name} missing"
    # every file of every package (templates, static files, data) travels in the wheel
    for src, dest in PACKAGES.items():
        for path in src.rglob("*"):
            if path.is_dir() or "__pycache__" in path.parts or path.suffix == ".pyc":
                continue
            arcname = f"{dest}/{path.relative_to(src).as_posix()}"
            assert arcname in names, f"{arcname} is not in the wheel"


def test_installed_commands_report_the_version(venv: Path) -> None:
    assert _run([str(venv / "rbroker"), "--version"], cwd=venv).strip() == f"rbroker {VERSION}"
    out = _run([str(venv / "rbroker-server"), "--version"], cwd=venv).strip()
    assert out == f"rbroker-server {VERSION}"


def test_installed_package_finds_its_icons_and_runs_its_migrations(
    venv: Path, tmp_path: Path
) -> None:
    # the installed package, not this checkout, answers
    where = _run(
        [str(venv / "python"), "-c", "import rbroker, rbroker_server; print(rbroker.__file__)"],
        cwd=tmp_path,
    ).strip()
    pkg = Path(where).parent
    assert ROOT not in pkg.parents, f"imported from the checkout: {pkg}"
    assert (pkg / "tray" / "assets" / "tray-idle.svg").is_file()
    data_dir = tmp_path / "server-data"
    out = _run(
        [
            str(venv / "rbroker-server"),
            "setup",
            "--non-interactive",
            "--data-dir",
            str(data_dir),
            "--public-hostname",
            "localhost",
            "--bind",
            "127.0.0.1",
        ],
        cwd=tmp_path,
    )
    assert "rbe_" in out and "rbv_" in out, out
    assert (data_dir / "config.toml").is_file()
    upgrade = _run(
        [str(venv / "rbroker-server"), "db", "upgrade", "--data-dir", str(data_dir)], cwd=tmp_path
    )
    assert upgrade.strip(), "db upgrade printed nothing"


def test_server_without_its_extra_says_so_in_one_line(base_venv: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    probe = [str(base_venv / "python"), "-c", "import sqlalchemy"]
    assert subprocess.run(probe, env=env, capture_output=True, check=False).returncode != 0
    # the base wheel still answers --version; every subcommand names the extra to install
    out = _run([str(base_venv / "rbroker-server"), "--version"], cwd=tmp_path).strip()
    assert out == f"rbroker-server {VERSION}"
    data = ["--data-dir", str(tmp_path / "data")]
    # every subcommand, as a user types it (none may start: the extra is missing)
    for line in (
        "setup --non-interactive",
        "serve --port 8787",
        "db upgrade",
        "group list",
        "token list --group g",
        "computer list",
        "enroll-code create --group g",
    ):
        argv = [*line.split(), *data]
        for cmd in (
            [str(base_venv / "rbroker-server")],
            [str(base_venv / "python"), "-m", "rbroker_server"],
        ):
            proc = subprocess.run(
                [*cmd, *argv],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert proc.returncode == 1, (argv, proc.returncode, proc.stderr)
            assert proc.stdout == ""
            lines = proc.stderr.splitlines()
            assert len(lines) == 1, (argv, proc.stderr)
            assert "Traceback" not in proc.stderr
            assert lines[0].startswith("rbroker-server: the coordinator needs rbroker[server]")
            assert "no module sqlalchemy" in lines[0], lines[0]
            assert f"pip install 'dist/{WHEEL_NAME}[server]'" in lines[0], lines[0]
    assert not (tmp_path / "data").exists(), "a command ran without the extra"


def test_readme_names_the_wheel_this_version_builds() -> None:
    """The operator guide installs the coordinator from the wheel; no document names another
    version's wheel or an install from a package index."""
    guide = (ROOT / "docs" / "operator-guide.md").read_text(encoding="utf-8")
    assert f"pip install 'dist/{WHEEL_NAME}[server]'" in guide
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = doc.read_text(encoding="utf-8")
        assert "pip install 'rbroker[server]'" not in text, f"{doc.name}: on no package index"
        named = set(re.findall(r"rbroker-(\d[^-\s]*)-py3-none-any\.whl", text))
        assert named <= {VERSION}, f"{doc.name} names wheels of versions {named}, not {VERSION}"


def test_the_source_package_carries_every_top_level_folder() -> None:
    """The source package holds what its tests read: every top-level folder of the checkout
    (the guides in docs/ were missing, so the README's link tests failed from an unpacked
    source package); the dot-folders (CI, the forge's settings) stay out."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    include = set(config["tool"]["hatch"]["build"]["targets"]["sdist"]["include"])
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=False
    ).stdout.split()
    if not tracked:
        pytest.skip("not a git checkout: the tracked folders are unknown")
    folders = {p.split("/")[0] for p in tracked if "/" in p and not p.startswith(".")}
    missing = folders - include
    assert not missing, f"top-level folders missing from pyproject's sdist include: {missing}"
    assert "README.md" in include
