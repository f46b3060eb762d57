"""Import boundaries of docs/architecture.md §1, checked statically (ast over every module)
and at run time.

- only `rbroker.tray` imports PySide6; only `rbroker.gpu.nvml` (the one gateway) imports
  pynvml, and `rbroker.gpu.fake_nvml`, which borrows its error type and structures;
- `rbroker_protocol` imports neither `rbroker` nor `rbroker_server`;
- `rbroker_server` never imports `rbroker`; `rbroker` never imports `rbroker_server`
  (nor the server's web stack);
- `import rbroker` (what a training job does) loads no NVML, Qt, pydantic or server code
  (the results it reads are the plain `TypedDict`s of `rbroker_protocol.results`);
- the broker's parts (`rbroker.broker.admission`, `.lessor`, ...) are imported only inside
  `rbroker.broker`: everything else, tests and benchmarks included, goes through the
  `Broker` façade in `rbroker.broker.service`.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Container, Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.contract  # it starts processes or servers of its own

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {
    "rbroker_protocol": ROOT / "shared" / "rbroker_protocol",
    "rbroker": ROOT / "desktop" / "rbroker",
    "rbroker_server": ROOT / "server" / "rbroker_server",
}
WEB_STACK = ("litestar", "sqlmodel", "sqlalchemy", "alembic", "uvicorn", "jinja2")
#: The parts behind the `Broker` façade (issue 11); only `rbroker.broker.*` imports them.
BROKER_PARTS = (
    "admission",
    "events",
    "overgrant",
    "resize",
    "restore",
    "sampling",
    "lessor",
    "simulation",
    "waiting",
)
#: Other trees whose imports of the broker's parts are checked too.
CALLERS = {"tests": ROOT / "tests", "bench": ROOT / "bench"}


def _module_name(package: str, root: Path, path: Path) -> str:
    parts = [package, *path.relative_to(root).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(
    source: str, module: str, is_package: bool, known: Container[str] | None = None
) -> Iterator[tuple[int, str]]:
    """`(line, absolute module name)` for every import in `source`, relative ones resolved,
    plus `importlib.import_module("...")` / `__import__("...")` with a literal name.

    `from pkg import name` yields `pkg` and `pkg.name` (the rules match either); given the
    `known` modules, it yields `pkg.name` for a known submodule and `pkg` only for a name
    that is not one (the import graph's edges: `from pkg import sub` runs `pkg/__init__`,
    but depends on `sub`)."""
    here = module.split(".") if is_package else module.split(".")[:-1]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - node.level + 1]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            subs = [f"{name}.{alias.name}" for alias in node.names]
            if known is None:
                yield node.lineno, name
                for sub in subs:  # `from rbroker import gpu` imports rbroker.gpu
                    yield node.lineno, sub
            else:
                found = [sub for sub in subs if sub in known]
                yield from ((node.lineno, sub) for sub in found)
                if len(found) < len(subs):
                    yield node.lineno, name
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            fname = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            arg = node.args[0]
            if (
                fname in ("import_module", "__import__")
                and isinstance(arg, ast.Constant)
                and isinstance(arg.value, str)
            ):
                yield node.lineno, arg.value


PYNVML_IMPORTERS = ("rbroker.gpu.nvml", "rbroker.gpu.fake_nvml")
"""The gateway, which calls pynvml, and the simulated library, which borrows its
`NVMLError`, its error codes and its memory structure (and calls nothing of it)."""


def violations(module: str, imported: str) -> list[str]:
    """The boundary rules `module` breaks by importing `imported`."""
    top = imported.split(".")[0]
    inside = module.split(".")
    out = []
    if top == "PySide6" and inside[:2] != ["rbroker", "tray"]:
        out.append("only rbroker.tray may import PySide6")
    if top == "pynvml" and module not in PYNVML_IMPORTERS:
        out.append("only rbroker.gpu.nvml (and the fake's types) may import pynvml")
    if inside[0] == "rbroker_protocol" and top in ("rbroker", "rbroker_server"):
        out.append("rbroker_protocol imports neither side")
    if inside[0] == "rbroker_server" and top == "rbroker":
        out.append("the server never imports rbroker")
    if inside[0] == "rbroker" and (top == "rbroker_server" or top in WEB_STACK):
        out.append("rbroker never imports the server or its web stack")
    parts = imported.split(".")
    if (
        parts[:2] == ["rbroker", "broker"]
        and len(parts) > 2
        and parts[2] in BROKER_PARTS
        and inside[:2] != ["rbroker", "broker"]
    ):
        out.append("only rbroker.broker imports the broker's parts (use the Broker façade)")
    return out


def _all_modules() -> Iterator[tuple[str, Path, bool]]:
    for package, root in PACKAGES.items():
        for path in sorted(root.rglob("*.py")):
            yield _module_name(package, root, path), path, path.name == "__init__.py"


def test_every_module_keeps_the_boundaries() -> None:
    found: list[str] = []
    checked = 0
    for module, path, is_package in _all_modules():
        checked += 1
        source = path.read_text(encoding="utf-8")
        for line, imported in imported_modules(source, module, is_package):
            for rule in violations(module, imported):
                found.append(f"{path.relative_to(ROOT)}:{line}: imports {imported}: {rule}")
    assert checked >= 30, f"only {checked} modules found: is the layout still {PACKAGES}?"
    assert not found, "\n".join(found)


def test_tests_and_benchmarks_use_the_broker_facade() -> None:
    found: list[str] = []
    for package, root in CALLERS.items():
        for path in sorted(root.rglob("*.py")):
            module = _module_name(package, root, path)
            source = path.read_text(encoding="utf-8")
            for line, imported in imported_modules(source, module, path.name == "__init__.py"):
                for rule in violations(module, imported):
                    if "broker's parts" in rule:
                        found.append(f"{path.relative_to(ROOT)}:{line}: imports {imported}")
    assert not found, "\n".join(found)


def test_the_broker_parts_exist_and_the_facade_imports_them() -> None:
    """The parts rule is not vacuous: each part is a module, and the façade uses them."""
    broker = PACKAGES["rbroker"] / "broker"
    for part in BROKER_PARTS:
        assert (broker / f"{part}.py").is_file(), part
    imported = {  # the façade (its lifecycle too: start, fail-closed retry, stop)
        name
        for _, name in imported_modules(
            (broker / "service.py").read_text(encoding="utf-8"), "rbroker.broker.service", False
        )
    }
    assert {f"rbroker.broker.{part}" for part in BROKER_PARTS} <= imported


def test_the_gateway_and_the_tray_are_where_the_imports_are() -> None:
    """The rules above are not vacuous: pynvml is imported by the gateway and the fake (and
    only there)."""
    importers = {
        module
        for module, path, is_package in _all_modules()
        for _, imported in imported_modules(path.read_text(encoding="utf-8"), module, is_package)
        if imported.split(".")[0] == "pynvml"
    }
    assert importers == set(PYNVML_IMPORTERS)


@pytest.mark.parametrize(
    ("module", "is_package", "source", "rule"),
    [
        ("rbroker.broker.service", False, "import pynvml", "pynvml"),
        ("rbroker.broker.service", False, "from pynvml import nvmlInit", "pynvml"),
        ("rbroker.cli.main", False, "from PySide6.QtWidgets import QApplication", "PySide6"),
        ("rbroker.tray", True, "from ..gpu import nvml", None),
        ("rbroker.tray.app", False, "from ..gpu.fake_nvml import FakeNvml", None),
        ("rbroker.tray.app", False, "from PySide6 import QtCore", None),
        ("rbroker.gpu.nvml", False, "import pynvml", None),
        ("rbroker.gpu.select", False, "import pynvml", "pynvml"),
        ("rbroker_protocol.errors", False, "from rbroker import lease", "neither side"),
        ("rbroker_protocol.errors", False, "from rbroker_server.app import x", "neither side"),
        ("rbroker_server.app", False, "import rbroker.localapi", "never imports rbroker"),
        ("rbroker.uplink.report", False, "import rbroker_server", "never imports the server"),
        ("rbroker.uplink.report", False, "from litestar import Litestar", "web stack"),
        ("rbroker.cli.demo", False, "importlib.import_module('rbroker_server.cli')", "server"),
        ("rbroker.broker.x", False, "from .. import gpu", None),
        ("rbroker.localapi.server", False, "from rbroker.broker.admission import A", "façade"),
        ("rbroker.tray.app", False, "from rbroker.broker import lessor", "façade"),
        ("rbroker.broker.service", False, "from .lessor import Lessor", None),
        ("rbroker.broker.admission", False, "from rbroker.broker.sampling import G", None),
        ("rbroker.localapi.server", False, "from rbroker.broker.service import Broker", None),
        ("rbroker_server.app", False, "from . import models", None),
    ],
)
def test_the_checker_catches_violations(
    module: str, is_package: bool, source: str, rule: str | None
) -> None:
    broken = [
        v
        for _, imported in imported_modules(source, module, is_package)
        for v in violations(module, imported)
    ]
    if rule is None:
        assert broken == []
    else:
        assert broken and any(rule in v for v in broken), broken


def test_relative_imports_are_resolved() -> None:
    names = [n for _, n in imported_modules("from ..gpu import nvml", "rbroker.broker.x", False)]
    assert names == ["rbroker.gpu", "rbroker.gpu.nvml"]
    names = [n for _, n in imported_modules("from . import local", "rbroker.client", True)]
    assert names == ["rbroker.client", "rbroker.client.local"]


def _loaded_after(imports: str) -> set[str]:
    """The modules a fresh interpreter has loaded after running `imports`."""
    code = f"import json, sys\n{imports}\nprint(json.dumps(sorted(sys.modules)))\n"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    return set(json.loads(out.stdout))


def _leaked(loaded: set[str], forbidden: tuple[str, ...]) -> list[str]:
    return sorted(m for m in loaded if m.split(".")[0] in forbidden)


def test_import_rbroker_loads_no_nvml_qt_pydantic_or_server_code() -> None:
    loaded = _loaded_after(
        "import rbroker\nrbroker.Client, rbroker.lease, rbroker.CapacityUnavailable"
    )
    assert "rbroker" in loaded and "rbroker.client.local" in loaded
    forbidden = ("pynvml", "PySide6", "shiboken6", "pydantic", "rbroker_server", *WEB_STACK)
    assert _leaked(loaded, forbidden) == []


def test_the_demo_package_loads_no_qt_or_server_code() -> None:
    """The demo world, its fleet and the local coordinator helper serve the CLI, the
    screenshot tool, the end-to-end tests and the benchmarks: no Qt, no server imports
    (the coordinator runs as a process)."""
    loaded = _loaded_after(
        "import rbroker.demo.world, rbroker.demo.fleet, rbroker.demo.coordinator\n"
        "import rbroker.demo.processes, rbroker.demo.job, rbroker.demo.worker"
    )
    assert "rbroker.demo.coordinator" in loaded
    assert _leaked(loaded, ("PySide6", "shiboken6", "rbroker_server", *WEB_STACK)) == []
