"""`rbroker tray` on the command line: the subcommand exists and a missing Qt is explained."""

from __future__ import annotations

import sys

import pytest

import rbroker
from rbroker.cli.main import build_parser, main


def test_tray_subcommand_parses_its_options() -> None:
    args = build_parser().parse_args(["tray", "--simulate", "--attach-only", "--show"])
    assert args.command == "tray"
    assert args.simulate == ""
    assert args.attach_only and args.show


def test_missing_pyside6_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "PySide6", None)  # what `import PySide6` sees when absent
    assert main(["tray"]) == 1
    err = capsys.readouterr().err
    assert f"pip install 'dist/rbroker-{rbroker.__version__}-py3-none-any.whl[desktop]'" in err
    assert "pip install '.[desktop]'" in err


def test_gui_script_entry_point_shares_the_message(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from rbroker.tray import main as tray_main

    monkeypatch.setitem(sys.modules, "PySide6", None)
    assert tray_main([]) == 1
    assert "py3-none-any.whl[desktop]" in capsys.readouterr().err
