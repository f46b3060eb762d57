"""What the hot commands load before they talk to the broker (issue 44, start-up;
docs/architecture.md §10): `rbroker status --json` (scripts, monitors) loads no rich, no
pydantic and no asyncio; `rbroker run` (one per wrapped job) no pydantic, no asyncio and no
rich (it loads rich only to say something: a wait, a refusal, a lost lease). A
fresh interpreter shows it; the names kept out are what the import graph must not grow
back."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.contract  # a fresh interpreter: nothing loaded before

PROBE = """
import json, sys
import rbroker.cli.main, rbroker.cli.status
status = sorted(sys.modules)
import rbroker.cli.run
print(json.dumps({"status": status, "run": sorted(sys.modules)}))
"""


def _banned(modules: list[str], banned: tuple[str, ...]) -> list[str]:
    return sorted({m for m in modules for b in banned if m == b or m.startswith(b + ".")})


def test_status_json_and_run_load_no_pydantic_asyncio_or_rich() -> None:
    done = subprocess.run(
        [sys.executable, "-I", "-c", PROBE], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout)
    heavy = ("pydantic", "asyncio", "PySide6", "psutil", "rbroker.broker", "rbroker_server")
    assert _banned(loaded["status"], (*heavy, "rich", "rbroker.cli.bookings")) == []
    assert _banned(loaded["run"], (*heavy, "rich")) == []
    assert "rbroker.cli.run" in loaded["run"]
