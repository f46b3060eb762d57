"""`rbroker.lease()` takes the same defaults as `rbroker run` where a description is
optional: project `default`, session the program's name, purpose `run <program name>`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import rbroker
from tests.conftest import BrokerProcess

pytestmark = pytest.mark.contract  # it starts processes or servers of its own

SHOW = """
import json, rbroker
with rbroker.lease(1024) as lease:
    print(json.dumps({k: lease.info[k] for k in ("project", "session", "purpose")}))
"""

ASYNC_SHOW = """
import asyncio, json, rbroker
async def main():
    async with rbroker.alease(1024, session="s-1") as lease:
        print(json.dumps({k: lease.info[k] for k in ("project", "session", "purpose")}))
asyncio.run(main())
"""


def _run(broker: BrokerProcess, args: list[str], cwd: Path) -> dict[str, str]:
    env = dict(os.environ, RBROKER_SOCKET=broker.socket)
    proc = subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def test_script_name_is_the_default_session_and_purpose(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    script = tmp_path / "train_vit.py"
    script.write_text(SHOW)
    seen = _run(broker, [str(script), "--secret-arg=never-sent"], tmp_path)
    assert seen == {"project": "default", "session": "train_vit.py", "purpose": "run train_vit.py"}


def test_module_and_inline_programs_get_their_names(broker: BrokerProcess, tmp_path: Path) -> None:
    pkg = tmp_path / "trainer"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "__main__.py").write_text(SHOW)
    assert _run(broker, ["-m", "trainer"], tmp_path)["session"] == "trainer"
    inline = _run(broker, ["-c", SHOW], tmp_path)
    assert inline == {"project": "default", "session": "python", "purpose": "run python"}


def test_alease_fills_only_what_is_missing(broker: BrokerProcess, tmp_path: Path) -> None:
    script = tmp_path / "embed.py"
    script.write_text(ASYNC_SHOW)
    seen = _run(broker, [str(script)], tmp_path)
    assert seen == {"project": "default", "session": "s-1", "purpose": "run embed.py"}


def test_cli_run_uses_the_same_project_default(broker: BrokerProcess, tmp_path: Path) -> None:
    show = (
        "import json, os, rbroker; c = rbroker.Client(); "
        "l = [x for x in c.leases()['leases'] if x['lease_id'] == os.environ['RBROKER_LEASE_ID']]; "
        "print(json.dumps({k: l[0][k] for k in ('project', 'session', 'purpose')}))"
    )
    rbroker_cmd = str(Path(sys.executable).parent / "rbroker")
    env = dict(os.environ, RBROKER_SOCKET=broker.socket)
    proc = subprocess.run(
        [rbroker_cmd, "run", "--mib", "1024", "--", sys.executable, "-c", show],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    cli = json.loads(proc.stdout.strip().splitlines()[-1])
    prog = Path(sys.executable).name
    assert cli == {"project": "default", "session": prog, "purpose": f"run {prog}"}


@pytest.mark.parametrize("wait_s", [-1.0, float("nan"), float("inf")])
def test_a_wait_that_is_negative_or_not_finite_is_refused_before_the_broker_is_asked(
    tmp_path: Path, wait_s: float
) -> None:
    """Before: a negative wait was quietly a wait of 0 (the deadline was clamped)."""
    ctx = rbroker.lease(64, wait_s=wait_s, socket=str(tmp_path / "no-broker.sock"))
    with pytest.raises(rbroker.InvalidParams, match="wait_s: must be at least 0 seconds"):
        ctx.__enter__()
