"""Import boundaries: the coordinator never imports the desktop package (architecture.md §1)."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import rbroker_server


def test_server_imports_neither_rbroker_nor_qt_nor_nvml() -> None:
    modules = [
        m.name
        for m in pkgutil.walk_packages(rbroker_server.__path__, "rbroker_server.")
        if ".migrations" not in m.name and not m.name.endswith("__main__")
    ]
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        "bad = sorted(m for m in sys.modules if m == 'rbroker' or m.startswith(('rbroker.', "
        "'PySide6', 'pynvml')))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_protocol_signing_and_reports_import_neither_side() -> None:
    code = (
        "import sys, rbroker_protocol.signing, rbroker_protocol.reports\n"
        "print(','.join(m for m in sys.modules if m.split('.')[0] in ('rbroker', "
        "'rbroker_server')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
