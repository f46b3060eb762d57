"""A broken simulation scenario file stops `rbroker broker --simulate FILE` with one line
that names the file and what is wrong in it (a real broker process)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rbroker.demo.processes import broker_address
from tests.conftest import short_tmp

pytestmark = pytest.mark.contract  # it starts processes or servers of its own


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('[[gpu]]\nname = "x\n', "not valid TOML: Illegal character '\\n' (at line 2"),
        ("[[gpu]]\ntotal_mib = 1\ncolour = 'blue'\n", "gpu #1: unknown keys ['colour']"),
        (b"\xff\xfe[[gpu]]\n", "not UTF-8 text (byte 0)"),
    ],
)
def test_a_broken_scenario_names_its_file(tmp_path: Path, text: str | bytes, says: str) -> None:
    scenario = tmp_path / "lab.toml"
    if isinstance(text, bytes):
        scenario.write_bytes(text)
    else:
        scenario.write_text(text)
    root = short_tmp()
    where = ["--socket", broker_address(root, "b"), "--data-dir", str(root / "data")]
    done = subprocess.run(
        [sys.executable, "-m", "rbroker", "broker", "--simulate", str(scenario), *where],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"rbroker: bad scenario: {scenario}: {says}"), lines[0]
